//! The one policy value the engine sends to saphan-launcher.
//!
//! The key set is closed: `version`, `workdir`, `writable`, `readable`,
//! `agent_sha256`. An unknown key is refused by name (`deny_unknown_fields`),
//! so a newer engine can never have a grant silently ignored by an older
//! launcher — new grants travel as more entries in `writable`, never as new
//! keys. Every other problem is reported with the name of the field.
#![forbid(unsafe_code)]

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::refusal::RefusalClass;

/// The only policy version this launcher understands.
pub const VERSION: u64 = 1;

/// The only value `readable` may take: reads are never restricted.
pub const READABLE_EVERYTHING: &str = "everything";

/// The wire shape. Field values are parsed as raw JSON first so that every
/// type error can name its field (serde's own type errors do not).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename = "policy")]
struct Wire {
    version: Value,
    workdir: Value,
    writable: Value,
    readable: Value,
    #[serde(default, deserialize_with = "present")]
    agent_sha256: Option<Value>,
}

/// Keeps an explicit `null` distinguishable from an absent key.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// A validated policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub workdir: PathBuf,
    pub writable: Vec<PathBuf>,
    pub agent_sha256: Option<String>,
}

/// Canonical serialisation: fixed key order, no optional key when absent.
#[derive(Serialize)]
struct Canonical<'a> {
    version: u64,
    workdir: &'a str,
    writable: Vec<&'a str>,
    readable: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_sha256: Option<&'a str>,
}

/// Why a policy was refused. The message always names the field (or, for a
/// JSON syntax error, the position).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError(String);

impl PolicyError {
    fn field(name: &str, what: impl fmt::Display) -> Self {
        PolicyError(format!("field `{name}` {what}"))
    }

    pub fn message(&self) -> &str {
        &self.0
    }

    /// Every policy error is `policy-invalid`.
    pub fn refusal_class(&self) -> RefusalClass {
        RefusalClass::PolicyInvalid
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PolicyError {}

fn describe(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 80 {
        let mut cut = 77;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

/// An absolute, normalised path: starts with `/`, no `.`/`..` components, no
/// empty or doubled separators, no trailing `/` (except `/` itself), no NUL.
fn absolute_path(field: &str, v: &Value) -> Result<PathBuf, PolicyError> {
    let Some(s) = v.as_str() else {
        return Err(PolicyError::field(
            field,
            format!("must be an absolute path string, found {}", describe(v)),
        ));
    };
    if s.is_empty() {
        return Err(PolicyError::field(field, "must not be empty"));
    }
    if s.contains('\0') {
        return Err(PolicyError::field(field, "must not contain a NUL byte"));
    }
    if !s.starts_with('/') {
        return Err(PolicyError::field(
            field,
            format!("must be an absolute path, found relative path {s:?}"),
        ));
    }
    if s != "/" {
        // Segments between the separators: none empty (no `//`, no trailing
        // `/`), none `.` or `..` (the engine sends real paths).
        for segment in s[1..].split('/') {
            if segment == "." || segment == ".." {
                return Err(PolicyError::field(
                    field,
                    format!("must not contain `.` or `..` components, found {s:?}"),
                ));
            }
            if segment.is_empty() {
                return Err(PolicyError::field(
                    field,
                    format!("must be a normalised path (no `//`, no trailing `/`), found {s:?}"),
                ));
            }
        }
    }
    Ok(PathBuf::from(s))
}

/// Parses and validates the policy JSON. This is the launcher's exact parser.
pub fn parse(json: &str) -> Result<Policy, PolicyError> {
    // serde would also accept a struct written as a positional array; the
    // policy is an object with named keys, nothing else.
    if !json
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return Err(PolicyError(
            "the policy must be a JSON object with the keys version, workdir, writable, \
             readable and optionally agent_sha256"
                .to_owned(),
        ));
    }
    let wire: Wire = serde_json::from_str(json).map_err(|e| PolicyError(e.to_string()))?;

    match wire.version.as_u64() {
        Some(VERSION) => {}
        _ => {
            return Err(PolicyError::field(
                "version",
                format!("must be {VERSION}, found {}", describe(&wire.version)),
            ))
        }
    }

    let workdir = absolute_path("workdir", &wire.workdir)?;

    let Some(items) = wire.writable.as_array() else {
        return Err(PolicyError::field(
            "writable",
            format!(
                "must be an array of absolute paths, found {}",
                describe(&wire.writable)
            ),
        ));
    };
    let mut writable = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let p = absolute_path(&format!("writable[{i}]"), item)?;
        if p == Path::new("/") {
            return Err(PolicyError::field(
                &format!("writable[{i}]"),
                "must not be `/` (that would grant writes everywhere)",
            ));
        }
        writable.push(p);
    }
    // The scratch directory `<workdir>/.saphan/tmp` is created inside the
    // domain, so the working directory must be writable.
    if !writable.iter().any(|w| workdir.starts_with(w)) {
        return Err(PolicyError::field(
            "writable",
            format!(
                "must contain `workdir` ({}) or a directory above it",
                workdir.display()
            ),
        ));
    }

    if wire.readable.as_str() != Some(READABLE_EVERYTHING) {
        return Err(PolicyError::field(
            "readable",
            format!(
                "must be \"{READABLE_EVERYTHING}\" (reads are not restricted), found {}",
                describe(&wire.readable)
            ),
        ));
    }

    let agent_sha256 = match wire.agent_sha256 {
        None => None,
        Some(v) => {
            let ok = v.as_str().filter(|s| {
                s.len() == 64
                    && s.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            });
            match ok {
                Some(s) => Some(s.to_owned()),
                None => {
                    return Err(PolicyError::field(
                        "agent_sha256",
                        format!("must be 64 lowercase hex digits, found {}", describe(&v)),
                    ))
                }
            }
        }
    };

    Ok(Policy {
        workdir,
        writable,
        agent_sha256,
    })
}

impl Policy {
    /// The canonical JSON form (what `parse` accepts back unchanged).
    pub fn to_canonical_json(&self) -> Result<String, PolicyError> {
        let as_str = |p: &Path| -> Result<String, PolicyError> {
            p.to_str()
                .map(str::to_owned)
                .ok_or_else(|| PolicyError(format!("path {} is not UTF-8", p.display())))
        };
        let workdir = as_str(&self.workdir)?;
        let writable = self
            .writable
            .iter()
            .map(|p| as_str(p))
            .collect::<Result<Vec<_>, _>>()?;
        let c = Canonical {
            version: VERSION,
            workdir: &workdir,
            writable: writable.iter().map(String::as_str).collect(),
            readable: READABLE_EVERYTHING,
            agent_sha256: self.agent_sha256.as_deref(),
        };
        serde_json::to_string(&c).map_err(|e| PolicyError(e.to_string()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"version":1,"workdir":"/far/wd","writable":["/far/wd","/home/a/.claude/projects/-far-wd"],"readable":"everything"}"#;

    fn err(json: &str) -> String {
        parse(json).unwrap_err().to_string()
    }

    #[test]
    fn accepts_the_documented_example_and_round_trips() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.workdir, PathBuf::from("/far/wd"));
        assert_eq!(p.writable.len(), 2);
        assert_eq!(p.agent_sha256, None);
        assert_eq!(p.to_canonical_json().unwrap(), GOOD);
        assert_eq!(parse(&p.to_canonical_json().unwrap()).unwrap(), p);
    }

    #[test]
    fn canonical_form_reorders_keys_and_keeps_the_digest() {
        let digest = "ab".repeat(32);
        let json = format!(
            r#"{{ "agent_sha256": "{digest}", "readable": "everything", "writable": ["/w"], "workdir": "/w/x", "version": 1 }}"#
        );
        let p = parse(&json).unwrap();
        assert_eq!(
            p.to_canonical_json().unwrap(),
            format!(
                r#"{{"version":1,"workdir":"/w/x","writable":["/w"],"readable":"everything","agent_sha256":"{digest}"}}"#
            )
        );
    }

    #[test]
    fn unknown_key_is_refused_by_name() {
        let json = GOOD.replace(r#""readable""#, r#""network":"none","readable""#);
        let msg = err(&json);
        assert!(msg.contains("unknown field `network`"), "{msg}");
    }

    #[test]
    fn missing_and_duplicate_keys_are_named() {
        let msg = err(r#"{"version":1,"writable":["/a"],"readable":"everything"}"#);
        assert!(msg.contains("missing field `workdir`"), "{msg}");
        let msg = err(
            r#"{"version":1,"version":1,"workdir":"/a","writable":["/a"],"readable":"everything"}"#,
        );
        assert!(msg.contains("duplicate field `version`"), "{msg}");
    }

    #[test]
    fn wrong_version_is_named() {
        for v in ["2", "0", "\"1\"", "1.0", "null", "-1"] {
            let msg = err(&GOOD.replace(r#""version":1"#, &format!(r#""version":{v}"#)));
            assert!(msg.starts_with("field `version` must be 1"), "{v}: {msg}");
        }
    }

    #[test]
    fn bad_workdirs_are_named() {
        for (wd, needle) in [
            ("\"\"", "must not be empty"),
            ("\"far/wd\"", "relative path"),
            ("\"./wd\"", "relative path"),
            ("\"/far/../etc\"", "`..`"),
            ("\"/far/./wd\"", "`.`"),
            ("\"/far//wd\"", "normalised"),
            ("\"/far/wd/\"", "normalised"),
            ("\"/far/\\u0000\"", "NUL"),
            ("7", "absolute path string"),
            ("null", "absolute path string"),
        ] {
            let msg = err(&GOOD.replace(r#""workdir":"/far/wd""#, &format!(r#""workdir":{wd}"#)));
            assert!(msg.starts_with("field `workdir`"), "{wd}: {msg}");
            assert!(msg.contains(needle), "{wd}: {msg}");
        }
    }

    #[test]
    fn bad_writable_entries_are_named_with_their_index() {
        let msg =
            err(r#"{"version":1,"workdir":"/a","writable":["/a","rel"],"readable":"everything"}"#);
        assert!(
            msg.starts_with("field `writable[1]` must be an absolute path"),
            "{msg}"
        );
        let msg = err(r#"{"version":1,"workdir":"/a","writable":"/a","readable":"everything"}"#);
        assert!(
            msg.starts_with("field `writable` must be an array"),
            "{msg}"
        );
        let msg =
            err(r#"{"version":1,"workdir":"/a","writable":["/a","/"],"readable":"everything"}"#);
        assert!(
            msg.starts_with("field `writable[1]` must not be `/`"),
            "{msg}"
        );
        let msg = err(r#"{"version":1,"workdir":"/a","writable":[],"readable":"everything"}"#);
        assert!(
            msg.starts_with("field `writable` must contain `workdir`"),
            "{msg}"
        );
        let msg = err(r#"{"version":1,"workdir":"/ab","writable":["/a"],"readable":"everything"}"#);
        assert!(
            msg.starts_with("field `writable` must contain `workdir`"),
            "{msg}"
        );
        // A directory above the workdir covers it.
        assert!(parse(
            r#"{"version":1,"workdir":"/a/b","writable":["/a"],"readable":"everything"}"#
        )
        .is_ok());
    }

    #[test]
    fn readable_must_be_everything() {
        for r in ["\"nothing\"", "[\"/\"]", "null", "\"Everything\""] {
            let msg =
                err(&GOOD.replace(r#""readable":"everything""#, &format!(r#""readable":{r}"#)));
            assert!(
                msg.starts_with("field `readable` must be \"everything\""),
                "{r}: {msg}"
            );
        }
    }

    #[test]
    fn agent_digest_must_be_64_lowercase_hex() {
        let ok = "0123456789abcdef".repeat(4);
        let with = |d: &str| {
            GOOD.replace(
                r#""readable""#,
                &format!(r#""agent_sha256":{d},"readable""#),
            )
        };
        assert_eq!(
            parse(&with(&format!("\"{ok}\"")))
                .unwrap()
                .agent_sha256
                .as_deref(),
            Some(ok.as_str())
        );
        for bad in [
            format!("\"{}\"", ok.to_uppercase()),
            format!("\"{}\"", &ok[..63]),
            format!("\"{ok}0\""),
            format!("\"{}g\"", &ok[..63]),
            "null".to_owned(),
            "42".to_owned(),
        ] {
            let msg = err(&with(&bad));
            assert!(
                msg.starts_with("field `agent_sha256` must be 64 lowercase hex"),
                "{bad}: {msg}"
            );
        }
    }

    #[test]
    fn non_objects_and_syntax_errors_are_refused() {
        for not_object in [
            "[]",
            "[1,\"/a\",[\"/a\"],\"everything\"]",
            "\"x\"",
            "1",
            "null",
            "",
        ] {
            assert!(
                err(not_object).starts_with("the policy must be a JSON object"),
                "{not_object}"
            );
        }
        assert!(err("{").contains("EOF"));
        assert!(err(&format!("{GOOD} x")).contains("trailing characters"));
    }
}
