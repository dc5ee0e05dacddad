"""Refusals are data: one closed table of classes, one exception type, and
one named constructor per class.

Every "cannot" in saphan is a :class:`Refusal` carrying a class from
:data:`CLASSES`, a message with the measured numbers, and a remediation. It
is built here, by the class's own constructor (``refusals.workdir_unsafe(
message, remediation)``), so a reader finds every place a class is raised
with one grep, and a class outside the table cannot be spelled. The CLI
prints it as ``refused [class]: message`` / ``fix: remediation`` and exits
with :data:`EXIT_CODE`; a run that was refused stores the class on its row.
docs/refusals.md carries the same table; tests/test_refusals.py holds the
table, the docs and these constructors against each other.
"""

from __future__ import annotations

from saphan.errors import REFUSAL_EXIT_CODE as EXIT_CODE
from saphan.errors import Refusal
from saphan.refusal_table import CLASSES

__all__ = [
    "CLASSES",
    "EXIT_CODE",
    "Refusal",
    "agent_auth_missing",
    "agent_auth_rejected",
    "agent_binary_missing",
    "bypass_token",
    "confinement_setting_invalid",
    "confinement_unavailable",
    "container_ineligible",
    "custody_binary_unsafe",
    "custody_key_unsafe",
    "digest_mismatch",
    "egress_uncuttable",
    "egress_unsupported_lane",
    "egress_unsupported_tool",
    "fleet_full",
    "landlock_below_floor",
    "landlock_incapable",
    "landlock_level_unknown",
    "landlock_unprobed",
    "model_substitution",
    "no_eligible_slot",
    "of_class",
    "policy_invalid",
    "policy_schema_mixed",
    "policy_schema_unknown",
    "record_signature_invalid",
    "scratch_not_ignored",
    "seat_full",
    "session_dir_foreign",
    "session_resumption",
    "workdir_busy",
    "workdir_missing",
    "workdir_unsafe",
]


def of_class(cls: str, message: str, remediation: str) -> Refusal:
    """A refusal whose class was reported by another program (the launcher's
    status line, a far script); ``ValueError`` when it is not in the table."""
    return Refusal(cls, message, remediation)


def confinement_unavailable(message: str, remediation: str) -> Refusal:
    """``confinement-unavailable``: no bubblewrap / no sandbox-exec / unrecognised OS on the control
    plane.
    """
    return Refusal("confinement-unavailable", message, remediation)


def confinement_setting_invalid(message: str, remediation: str) -> Refusal:
    """``confinement-setting-invalid``: run.confinement is not exactly `engine` or `vendor` (checked
    before any other branch).
    """
    return Refusal("confinement-setting-invalid", message, remediation)


def landlock_unprobed(message: str, remediation: str) -> Refusal:
    """``landlock-unprobed``: the target machine's row has no measured Landlock level."""
    return Refusal("landlock-unprobed", message, remediation)


def landlock_incapable(message: str, remediation: str) -> Refusal:
    """``landlock-incapable``: the target machine measured Landlock level 0."""
    return Refusal("landlock-incapable", message, remediation)


def landlock_below_floor(message: str, remediation: str) -> Refusal:
    """``landlock-below-floor``: the target machine measured a Landlock level below the floor (3)."""
    return Refusal("landlock-below-floor", message, remediation)


def landlock_level_unknown(message: str, remediation: str) -> Refusal:
    """``landlock-level-unknown``: a measured Landlock level above the highest this engine knows."""
    return Refusal("landlock-level-unknown", message, remediation)


def bypass_token(message: str, remediation: str) -> Refusal:
    """``bypass-token``: the final argv carries a bypass token."""
    return Refusal("bypass-token", message, remediation)


def model_substitution(message: str, remediation: str) -> Refusal:
    """``model-substitution``: the final argv could yield a model other than the one named."""
    return Refusal("model-substitution", message, remediation)


def session_resumption(message: str, remediation: str) -> Refusal:
    """``session-resumption``: the final argv would continue another session silently."""
    return Refusal("session-resumption", message, remediation)


def seat_full(message: str, remediation: str) -> Refusal:
    """``seat-full``: no free ordinal on the slot after conflict handling."""
    return Refusal("seat-full", message, remediation)


def egress_uncuttable(message: str, remediation: str) -> Refusal:
    """``egress-uncuttable``: a run declares an egress policy and this host cannot cut the network."""
    return Refusal("egress-uncuttable", message, remediation)


def egress_unsupported_lane(message: str, remediation: str) -> Refusal:
    """``egress-unsupported-lane``: egress policy on a Landlock host (no network lever in this
    build).
    """
    return Refusal("egress-unsupported-lane", message, remediation)


def egress_unsupported_tool(message: str, remediation: str) -> Refusal:
    """``egress-unsupported-tool``: an egress policy on a tool that confines itself."""
    return Refusal("egress-unsupported-tool", message, remediation)


def record_signature_invalid(message: str, remediation: str) -> Refusal:
    """``record-signature-invalid``: a machine row's or a run record's signature does not verify (a
    run record is shown, flagged, never hidden).
    """
    return Refusal("record-signature-invalid", message, remediation)


def container_ineligible(message: str, remediation: str) -> Refusal:
    """``container-ineligible``: the cast names an image digest and no fresh probe-confirmed docker-
    oci row matches.
    """
    return Refusal("container-ineligible", message, remediation)


def digest_mismatch(message: str, remediation: str) -> Refusal:
    """``digest-mismatch``: a delivered or executed binary's SHA-256/version differs from the pin (a
    launcher's, or a slot's agent binary pin).
    """
    return Refusal("digest-mismatch", message, remediation)


def custody_binary_unsafe(message: str, remediation: str) -> Refusal:
    """``custody-binary-unsafe``: the running binary is replaceable by an identity that is not its
    custodian.
    """
    return Refusal("custody-binary-unsafe", message, remediation)


def custody_key_unsafe(message: str, remediation: str) -> Refusal:
    """``custody-key-unsafe``: a workspace key file fails owner-only / no-follow / exact-length
    custody, or a lane credential file or the lanes file fails owner-only / no-follow / one-link
    / size custody.
    """
    return Refusal("custody-key-unsafe", message, remediation)


def policy_schema_unknown(message: str, remediation: str) -> Refusal:
    """``policy-schema-unknown``: a permission class names a schema version outside the accepted
    set.
    """
    return Refusal("policy-schema-unknown", message, remediation)


def policy_schema_mixed(message: str, remediation: str) -> Refusal:
    """``policy-schema-mixed``: a permission class uses a feature of a schema version it does not
    claim.
    """
    return Refusal("policy-schema-mixed", message, remediation)


def policy_invalid(message: str, remediation: str) -> Refusal:
    """``policy-invalid``: a permission class or launcher policy is malformed."""
    return Refusal("policy-invalid", message, remediation)


def session_dir_foreign(message: str, remediation: str) -> Refusal:
    """``session-dir-foreign``: the preflight reported a session dir that is not this run's own
    leaf.
    """
    return Refusal("session-dir-foreign", message, remediation)


def workdir_missing(message: str, remediation: str) -> Refusal:
    """``workdir-missing``: the working directory does not exist."""
    return Refusal("workdir-missing", message, remediation)


def workdir_busy(message: str, remediation: str) -> Refusal:
    """``workdir-busy``: a far run's working directory overlaps another live run's on the same
    machine (the same directory, one inside the other, or the same Claude Code session leaf).
    """
    return Refusal("workdir-busy", message, remediation)


def workdir_unsafe(message: str, remediation: str) -> Refusal:
    """``workdir-unsafe``: a path saphan was about to create, read or grant in the working directory
    holds a planted link or is not what saphan made (named in the message).
    """
    return Refusal("workdir-unsafe", message, remediation)


def host_key_mismatch(message: str, remediation: str) -> Refusal:
    """``host-key-mismatch``: an SSH machine presented another host key than the one pinned at
    `machine add`.
    """
    return Refusal("host-key-mismatch", message, remediation)


def network_posture_unenforceable(message: str, remediation: str) -> Refusal:
    """``network-posture-unenforceable``: a permission class says `network: off` and nothing on
    the run's path enforces it.
    """
    return Refusal("network-posture-unenforceable", message, remediation)


def agent_auth_missing(message: str, remediation: str) -> Refusal:
    """``agent-auth-missing``: an agent run has no credential to present to its endpoint: no key
    variable set in saphan's environment and no login file of the tool's.
    """
    return Refusal("agent-auth-missing", message, remediation)


def agent_auth_rejected(message: str, remediation: str) -> Refusal:
    """``agent-auth-rejected``: the endpoint answered the auth pre-flight with HTTP 401 or 403 for
    the seat's credential.
    """
    return Refusal("agent-auth-rejected", message, remediation)


def agent_binary_missing(message: str, remediation: str) -> Refusal:
    """``agent-binary-missing``: the agent binary a slot runs is not present (or not executable) at
    the path resolved for it on the machine.
    """
    return Refusal("agent-binary-missing", message, remediation)


def scratch_not_ignored(message: str, remediation: str) -> Refusal:
    """``scratch-not-ignored``: a measure-base scratch path the repository does not ignore
    (the remediation names the rule to add).
    """
    return Refusal("scratch-not-ignored", message, remediation)


def fleet_full(message: str, remediation: str) -> Refusal:
    """``fleet-full``: every candidate slot of a cast is at capacity."""
    return Refusal("fleet-full", message, remediation)


def no_eligible_slot(message: str, remediation: str) -> Refusal:
    """``no-eligible-slot``: a cast found no slot that can take the run."""
    return Refusal("no-eligible-slot", message, remediation)
