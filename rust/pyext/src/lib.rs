//! `saphan._native`: the registry of saphan-core functions exposed to Python.
//!
//! Each export is a thin wrapper: arguments in, one call into saphan-core,
//! result out. Errors cross into Python in one place (`error.rs`), and Rust
//! values become Python objects in one place (`convert.rs`). The module is
//! private; saphan's public API is Python.
#![forbid(unsafe_code)]

mod convert;
mod error;

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use saphan_core::binary_custody::{self, Caller};
use saphan_core::{digest, grant, landlock, policy, process, secret_file, RefusalClass};

pub use error::KeyCustodyError;
use error::NativeError;

/// `(level, reason)`: the running kernel's Landlock ABI (0 when unusable) and
/// `"supported"`, `"enosys"`, `"eopnotsupp"` or `"errno-N"`.
#[pyfunction]
fn landlock_abi() -> (u32, String) {
    let probe = landlock::AbiProbe::detect();
    (probe.level(), probe.reason())
}

/// The lowest Landlock ABI saphan confines with (3: truncation covered).
#[pyfunction]
fn landlock_floor() -> u32 {
    landlock::FLOOR
}

/// The highest Landlock ABI this build handles; a recorded level above it is
/// not believed.
#[pyfunction]
fn landlock_highest_known() -> u32 {
    landlock::HIGHEST_KNOWN
}

/// SHA-256 of a file as 64 lowercase hex digits (the GIL is released while
/// reading).
#[pyfunction]
fn sha256_file(py: Python<'_>, path: PathBuf) -> Result<String, NativeError> {
    py.detach(|| digest::sha256_file(&path).map_err(|e| NativeError::io(&path, e)))
}

/// SHA-256 of a byte string as 64 lowercase hex digits.
#[pyfunction]
fn sha256_bytes(data: &[u8]) -> String {
    digest::sha256_bytes(data)
}

/// HMAC-SHA256 of `data` under `key`, as 64 lowercase hex digits.
#[pyfunction]
fn hmac_sha256(key: &[u8], data: &[u8]) -> String {
    digest::hmac_sha256(key, data)
}

/// Whether two strings are equal, compared in constant time.
#[pyfunction]
fn digests_equal(a: &str, b: &str) -> bool {
    digest::constant_time_eq(a.as_bytes(), b.as_bytes())
}

/// `None` when the four custody clauses hold for this process; otherwise a
/// dict describing the failed clause.
#[pyfunction]
fn check_binary_custody(py: Python<'_>, path: PathBuf) -> PyResult<Option<Bound<'_, PyDict>>> {
    let caller = Caller::current().map_err(|e| NativeError::io(&path, e))?;
    convert::custody_outcome(py, binary_custody::check_binary(&path, &caller))
}

/// As `check_binary_custody`, for an explicit caller (tests).
#[pyfunction]
fn check_binary_custody_as(
    py: Python<'_>,
    path: PathBuf,
    euid: u32,
    groups: Vec<u32>,
) -> PyResult<Option<Bound<'_, PyDict>>> {
    let caller = Caller::new(euid, groups);
    convert::custody_outcome(py, binary_custody::check_binary(&path, &caller))
}

/// Reads a key file after its custody checks (owner-only, no symlink, exact
/// length, all before a byte is read).
#[pyfunction]
fn read_key_file(
    py: Python<'_>,
    path: PathBuf,
    length: u64,
) -> Result<Bound<'_, PyBytes>, NativeError> {
    let bytes = py.detach(|| secret_file::read_key_file(&path, length))?;
    Ok(PyBytes::new(py, &bytes))
}

/// Reads a lane credential file (an API key) after its custody checks
/// (owner-only, no symlink, one hard link, 1 to `max_len` bytes, all before a
/// byte is read). The bytes come back as they are; the caller strips.
#[pyfunction]
fn read_secret_file(
    py: Python<'_>,
    path: PathBuf,
    max_len: u64,
) -> Result<Bound<'_, PyBytes>, NativeError> {
    let bytes = py.detach(|| secret_file::read_secret_file(&path, max_len))?;
    Ok(PyBytes::new(py, &bytes))
}

/// Reads the lanes file after a credential's custody checks (it says where
/// every lane key is sent).
#[pyfunction]
fn read_lanes_file(
    py: Python<'_>,
    path: PathBuf,
    max_len: u64,
) -> Result<Bound<'_, PyBytes>, NativeError> {
    let bytes = py.detach(|| secret_file::read_lanes_file(&path, max_len))?;
    Ok(PyBytes::new(py, &bytes))
}

/// `prctl(PR_SET_PDEATHSIG, sig)` on the calling process (used between fork
/// and exec: the child is killed with `sig` when its parent dies).
#[pyfunction]
fn set_parent_death_signal(sig: i32) -> PyResult<()> {
    process::set_parent_death_signal(sig).map_err(PyErr::from)
}

/// Sets the calling process's dumpable flag; returns the previous setting.
#[pyfunction]
fn set_dumpable(on: bool) -> PyResult<bool> {
    process::set_dumpable(on).map_err(PyErr::from)
}

/// Parses a launcher policy with the launcher's own parser and returns its
/// canonical JSON; raises ValueError with the parser's message.
#[pyfunction]
fn parse_policy(json: &str) -> Result<String, NativeError> {
    Ok(policy::parse(json)?.to_canonical_json()?)
}

/// `None` when `path` may be granted as a writable directory (absolute,
/// normalised, a real directory reached from `/` without any symbolic link);
/// otherwise the message naming the component at fault — the same text the
/// launcher refuses the same layout with.
#[pyfunction]
fn check_grant_dir(py: Python<'_>, path: &str) -> Option<String> {
    let path = path.to_owned();
    py.detach(|| grant::check_grant_dir(Path::new(&path)).err())
        .map(|e| e.describe().0)
}

/// An `O_PATH | O_CLOEXEC` descriptor of the directory `path`, reached by
/// the same walk as `check_grant_dir` (no symbolic link at any component):
/// what bubblewrap binds (`--bind-fd`), so a directory swapped for a link
/// after the check is not what gets bound. The caller owns the descriptor.
/// Raises `ValueError` with the grant rule's message.
#[pyfunction]
fn open_grant_dir(py: Python<'_>, path: &str) -> PyResult<i32> {
    use std::os::fd::IntoRawFd;

    let path = path.to_owned();
    py.detach(|| grant::open_grant_dir(Path::new(&path)))
        .map(IntoRawFd::into_raw_fd)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.describe().0))
}

/// Every refusal class rust/core and saphan-launcher can report, in the
/// table's order: the names of `saphan_core::RefusalClass` (held equal to
/// `saphan.refusals.CLASSES` by tests/test_refusal_classes_rust.py).
#[pyfunction]
fn refusal_classes() -> Vec<&'static str> {
    RefusalClass::ALL.iter().map(|c| c.as_str()).collect()
}

/// The crate version, shared by the whole workspace.
#[pyfunction]
fn version() -> &'static str {
    saphan_core::VERSION
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("KeyCustodyError", m.py().get_type::<KeyCustodyError>())?;
    m.add_function(wrap_pyfunction!(landlock_abi, m)?)?;
    m.add_function(wrap_pyfunction!(landlock_floor, m)?)?;
    m.add_function(wrap_pyfunction!(landlock_highest_known, m)?)?;
    m.add_function(wrap_pyfunction!(sha256_file, m)?)?;
    m.add_function(wrap_pyfunction!(sha256_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(open_grant_dir, m)?)?;
    m.add_function(wrap_pyfunction!(hmac_sha256, m)?)?;
    m.add_function(wrap_pyfunction!(digests_equal, m)?)?;
    m.add_function(wrap_pyfunction!(check_binary_custody, m)?)?;
    m.add_function(wrap_pyfunction!(check_binary_custody_as, m)?)?;
    m.add_function(wrap_pyfunction!(read_key_file, m)?)?;
    m.add_function(wrap_pyfunction!(read_secret_file, m)?)?;
    m.add_function(wrap_pyfunction!(read_lanes_file, m)?)?;
    m.add_function(wrap_pyfunction!(set_parent_death_signal, m)?)?;
    m.add_function(wrap_pyfunction!(set_dumpable, m)?)?;
    m.add_function(wrap_pyfunction!(parse_policy, m)?)?;
    m.add_function(wrap_pyfunction!(check_grant_dir, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(refusal_classes, m)?)?;
    Ok(())
}
