"""The closed table of refusal classes (SPEC.md §4): class -> when it is raised.

Data only. docs/refusals.md carries the same table (tests/test_refusals.py
holds the two against each other) and rust/core's RefusalClass the same names
(tests/test_refusal_classes_rust.py).
"""

from __future__ import annotations

#: class -> when it is raised (the docs' refusal table mirrors this).
CLASSES: dict[str, str] = {
    "confinement-unavailable": (
        "no bubblewrap / no sandbox-exec / unrecognised OS on the control plane"
    ),
    "confinement-setting-invalid": (
        "run.confinement is not exactly `engine` or `vendor` (checked before any other branch)"
    ),
    "landlock-unprobed": "the target machine's row has no measured Landlock level",
    "landlock-incapable": "the target machine measured Landlock level 0",
    "landlock-below-floor": "the target machine measured a Landlock level below the floor (3)",
    "landlock-level-unknown": "a measured Landlock level above the highest this engine knows",
    "bypass-token": "the final argv carries a bypass token",
    "model-substitution": "the final argv could yield a model other than the one named",
    "session-resumption": "the final argv would continue another session silently",
    "seat-full": "no free ordinal on the slot after conflict handling",
    "egress-uncuttable": (
        "a run declares an egress policy and this host cannot cut the network (no network "
        "namespace, the door's bridge cannot start, or a boundary whose network rule is not "
        "measured)"
    ),
    "egress-unsupported-lane": (
        "a run declares an egress policy on a Landlock lane, local or far (no network lever "
        "in this build)"
    ),
    "egress-unsupported-tool": (
        "a run declares an egress policy on Claude Code under run.confinement = vendor: "
        "nothing of saphan's is around the tool to cut"
    ),
    "record-signature-invalid": (
        "a machine row's or a run record's signature does not verify (a run record is shown, "
        "flagged, never hidden)"
    ),
    "container-ineligible": (
        "the cast names an image digest and no fresh probe-confirmed docker-oci row matches"
    ),
    "digest-mismatch": (
        "a delivered or executed binary's SHA-256/version differs from the pin (a launcher's, "
        "or a slot's agent binary pin)"
    ),
    "custody-binary-unsafe": "the running binary is replaceable by an identity that is not its custodian",
    "custody-key-unsafe": (
        "a workspace key file fails owner-only / no-follow / exact-length custody, or a lane "
        "credential file or the lanes file fails owner-only / no-follow / one-link / size custody"
    ),
    "policy-schema-unknown": "a permission class names a schema version outside the accepted set",
    "policy-schema-mixed": "a permission class uses a feature of a schema version it does not claim",
    "policy-invalid": "a permission class or launcher policy is malformed",
    "session-dir-foreign": "the preflight reported a session dir that is not this run's own leaf",
    "workdir-missing": "the working directory does not exist",
    "workdir-unsafe": (
        "a path saphan was about to create, read or grant in the working directory holds a "
        "planted link or is not what saphan made (named in the message)"
    ),
    "host-key-mismatch": (
        "an SSH machine presented another host key than the one pinned at `machine add`"
    ),
    "network-posture-unenforceable": (
        "a permission class says `network: off` and nothing on the run's path enforces it"
    ),
    "agent-auth-missing": (
        "an agent run has no credential to present to its endpoint: no key variable set in "
        "saphan's environment and no login file of the tool's"
    ),
    "agent-auth-rejected": (
        "the endpoint answered the auth pre-flight with HTTP 401 or 403 for the seat's credential"
    ),
    "agent-binary-missing": (
        "the agent binary a slot runs is not present (or not executable) at the path resolved "
        "for it on the machine"
    ),
    "workdir-busy": (
        "a far run's working directory overlaps another live run's on the same machine (the "
        "same directory, one inside the other, or the same Claude Code session leaf)"
    ),
    "scratch-not-ignored": (
        "a measure-base order names a scratch path the repository does not ignore: its clone "
        "would be the run's own uncommitted work"
    ),
    "fleet-full": (
        "a cast found candidate slots and every one at capacity after conflict handling (each "
        "named with its numbers)"
    ),
    "no-eligible-slot": (
        "a cast found no slot that can take the run: none of the tool, none whose machine can "
        "give its boundary, none matching the labels (each named with why)"
    ),
}
