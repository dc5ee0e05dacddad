//! The closed table of refusal classes (SPEC.md §4), as one enum.
//!
//! Every refusal saphan-core reports and every refusal saphan-launcher
//! prints carries a [`RefusalClass`]; [`RefusalClass::as_str`] is the exact
//! kebab-case name that appears in `refused [CLASS]: ...` and on the status
//! descriptor. The authoritative table is Python's `saphan.refusals.CLASSES`;
//! `saphan._native.refusal_classes()` exposes [`RefusalClass::ALL`] so that
//! tests/test_refusal_classes_rust.py holds the two equal.
#![forbid(unsafe_code)]

use std::fmt;
use std::str::FromStr;

/// One class of the closed refusal table, in the table's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefusalClass {
    ConfinementUnavailable,
    ConfinementSettingInvalid,
    LandlockUnprobed,
    LandlockIncapable,
    LandlockBelowFloor,
    LandlockLevelUnknown,
    BypassToken,
    ModelSubstitution,
    SessionResumption,
    SeatFull,
    EgressUncuttable,
    EgressUnsupportedLane,
    EgressUnsupportedTool,
    RecordSignatureInvalid,
    ContainerIneligible,
    DigestMismatch,
    CustodyBinaryUnsafe,
    CustodyKeyUnsafe,
    PolicySchemaUnknown,
    PolicySchemaMixed,
    PolicyInvalid,
    SessionDirForeign,
    WorkdirMissing,
    WorkdirUnsafe,
    HostKeyMismatch,
    NetworkPostureUnenforceable,
    AgentAuthMissing,
    AgentAuthRejected,
    AgentBinaryMissing,
    WorkdirBusy,
    ScratchNotIgnored,
    FleetFull,
    NoEligibleSlot,
}

impl RefusalClass {
    /// Every class, in the table's order.
    pub const ALL: [RefusalClass; 33] = [
        RefusalClass::ConfinementUnavailable,
        RefusalClass::ConfinementSettingInvalid,
        RefusalClass::LandlockUnprobed,
        RefusalClass::LandlockIncapable,
        RefusalClass::LandlockBelowFloor,
        RefusalClass::LandlockLevelUnknown,
        RefusalClass::BypassToken,
        RefusalClass::ModelSubstitution,
        RefusalClass::SessionResumption,
        RefusalClass::SeatFull,
        RefusalClass::EgressUncuttable,
        RefusalClass::EgressUnsupportedLane,
        RefusalClass::EgressUnsupportedTool,
        RefusalClass::RecordSignatureInvalid,
        RefusalClass::ContainerIneligible,
        RefusalClass::DigestMismatch,
        RefusalClass::CustodyBinaryUnsafe,
        RefusalClass::CustodyKeyUnsafe,
        RefusalClass::PolicySchemaUnknown,
        RefusalClass::PolicySchemaMixed,
        RefusalClass::PolicyInvalid,
        RefusalClass::SessionDirForeign,
        RefusalClass::WorkdirMissing,
        RefusalClass::WorkdirUnsafe,
        RefusalClass::HostKeyMismatch,
        RefusalClass::NetworkPostureUnenforceable,
        RefusalClass::AgentAuthMissing,
        RefusalClass::AgentAuthRejected,
        RefusalClass::AgentBinaryMissing,
        RefusalClass::WorkdirBusy,
        RefusalClass::ScratchNotIgnored,
        RefusalClass::FleetFull,
        RefusalClass::NoEligibleSlot,
    ];

    /// The class's name, exactly as printed in `refused [CLASS]`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RefusalClass::ConfinementUnavailable => "confinement-unavailable",
            RefusalClass::ConfinementSettingInvalid => "confinement-setting-invalid",
            RefusalClass::LandlockUnprobed => "landlock-unprobed",
            RefusalClass::LandlockIncapable => "landlock-incapable",
            RefusalClass::LandlockBelowFloor => "landlock-below-floor",
            RefusalClass::LandlockLevelUnknown => "landlock-level-unknown",
            RefusalClass::BypassToken => "bypass-token",
            RefusalClass::ModelSubstitution => "model-substitution",
            RefusalClass::SessionResumption => "session-resumption",
            RefusalClass::SeatFull => "seat-full",
            RefusalClass::EgressUncuttable => "egress-uncuttable",
            RefusalClass::EgressUnsupportedLane => "egress-unsupported-lane",
            RefusalClass::EgressUnsupportedTool => "egress-unsupported-tool",
            RefusalClass::RecordSignatureInvalid => "record-signature-invalid",
            RefusalClass::ContainerIneligible => "container-ineligible",
            RefusalClass::DigestMismatch => "digest-mismatch",
            RefusalClass::CustodyBinaryUnsafe => "custody-binary-unsafe",
            RefusalClass::CustodyKeyUnsafe => "custody-key-unsafe",
            RefusalClass::PolicySchemaUnknown => "policy-schema-unknown",
            RefusalClass::PolicySchemaMixed => "policy-schema-mixed",
            RefusalClass::PolicyInvalid => "policy-invalid",
            RefusalClass::SessionDirForeign => "session-dir-foreign",
            RefusalClass::WorkdirMissing => "workdir-missing",
            RefusalClass::WorkdirUnsafe => "workdir-unsafe",
            RefusalClass::HostKeyMismatch => "host-key-mismatch",
            RefusalClass::NetworkPostureUnenforceable => "network-posture-unenforceable",
            RefusalClass::AgentAuthMissing => "agent-auth-missing",
            RefusalClass::AgentAuthRejected => "agent-auth-rejected",
            RefusalClass::AgentBinaryMissing => "agent-binary-missing",
            RefusalClass::WorkdirBusy => "workdir-busy",
            RefusalClass::ScratchNotIgnored => "scratch-not-ignored",
            RefusalClass::FleetFull => "fleet-full",
            RefusalClass::NoEligibleSlot => "no-eligible-slot",
        }
    }

    /// The class named `name`; `None` for a name outside the table.
    pub fn from_name(name: &str) -> Option<Self> {
        RefusalClass::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl fmt::Display for RefusalClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not in the closed table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownRefusalClass(pub String);

impl fmt::Display for UnknownRefusalClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown refusal class {:?}", self.0)
    }
}

impl std::error::Error for UnknownRefusalClass {}

impl FromStr for RefusalClass {
    type Err = UnknownRefusalClass;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RefusalClass::from_name(s).ok_or_else(|| UnknownRefusalClass(s.to_owned()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// `LandlockBelowFloor` -> `landlock-below-floor`.
    fn kebab(variant: &str) -> String {
        let mut out = String::new();
        for (i, ch) in variant.chars().enumerate() {
            if ch.is_ascii_uppercase() {
                if i > 0 {
                    out.push('-');
                }
                out.push(ch.to_ascii_lowercase());
            } else {
                out.push(ch);
            }
        }
        out
    }

    #[test]
    fn all_lists_every_variant_once_in_declaration_order() {
        // Discriminants run 0..N without gaps, so ALL[i] == i for every i
        // and a last index of N-1 mean no variant is missing from ALL.
        for (i, c) in RefusalClass::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c:?}");
        }
        assert_eq!(
            RefusalClass::NoEligibleSlot as usize + 1,
            RefusalClass::ALL.len()
        );
    }

    #[test]
    fn names_round_trip() {
        for c in RefusalClass::ALL {
            assert_eq!(RefusalClass::from_name(c.as_str()), Some(c));
            assert_eq!(c.as_str().parse::<RefusalClass>(), Ok(c));
            assert_eq!(c.to_string(), c.as_str());
        }
        let names: BTreeSet<&str> = RefusalClass::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), RefusalClass::ALL.len());
    }

    #[test]
    fn names_are_the_variants_in_kebab_case() {
        for c in RefusalClass::ALL {
            let name = c.as_str();
            assert_eq!(name, kebab(&format!("{c:?}")));
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{name}"
            );
            assert!(!name.starts_with('-') && !name.ends_with('-') && !name.contains("--"));
        }
    }

    #[test]
    fn unknown_names_are_refused() {
        for bad in [
            "",
            "seat_full",
            "Seat-Full",
            "seat-full ",
            "policy",
            "custody",
        ] {
            assert_eq!(RefusalClass::from_name(bad), None, "{bad:?}");
            let err = bad.parse::<RefusalClass>().unwrap_err();
            assert_eq!(err, UnknownRefusalClass(bad.to_owned()));
        }
        assert_eq!(
            "nope".parse::<RefusalClass>().unwrap_err().to_string(),
            "unknown refusal class \"nope\""
        );
    }
}
