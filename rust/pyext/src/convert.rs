//! Rust values → Python objects.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use saphan_core::{BinaryCustodyError, StatFacts};

use crate::error::NativeError;

/// `None` for a pass; a dict for a failed clause; OSError when the facts
/// could not be measured.
pub fn custody_outcome<'py>(
    py: Python<'py>,
    outcome: Result<StatFacts, BinaryCustodyError>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let violation = match outcome {
        Ok(_) => return Ok(None),
        Err(BinaryCustodyError::Unsafe(v)) => v,
        Err(other) => return Err(NativeError::from(other).into()),
    };
    let f = &violation.facts;
    let d = PyDict::new(py);
    d.set_item("clause", violation.clause.number())?;
    d.set_item("path", f.path.display().to_string())?;
    d.set_item(
        "symlink_from",
        f.symlink_from.as_ref().map(|p| p.display().to_string()),
    )?;
    d.set_item("owner_uid", f.owner_uid)?;
    d.set_item("group_gid", f.group_gid)?;
    d.set_item("mode", f.mode)?;
    d.set_item("parent", f.parent.display().to_string())?;
    d.set_item("parent_owner_uid", f.parent_owner_uid)?;
    d.set_item("parent_group_gid", f.parent_group_gid)?;
    d.set_item("parent_mode", f.parent_mode)?;
    d.set_item("caller_euid", violation.caller.euid)?;
    d.set_item("caller_groups", violation.caller.groups.clone())?;
    let (message, remediation) = violation.describe();
    d.set_item("message", message)?;
    d.set_item("remediation", remediation)?;
    d.set_item("not_asserted", saphan_core::binary_custody::NOT_ASSERTED)?;
    Ok(Some(d))
}
