//! The one place saphan-core errors become Python exceptions.
//!
//! * policy errors          → `ValueError(message)`
//! * key custody refusals   → `saphan._native.KeyCustodyError(message, remediation)`
//! * plain I/O errors       → `OSError(errno, strerror, path)`, which Python
//!   narrows to its subclass (`FileNotFoundError`, `PermissionError`, …)
//! * anything else          → `RuntimeError(message)`

use std::io;
use std::path::Path;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

use saphan_core::{BinaryCustodyError, Error, KeyCustodyError as CoreKeyError};

create_exception!(
    saphan._native,
    KeyCustodyError,
    PyException,
    "A key or credential file failed its custody checks (owner-only mode, no symlink, regular \
     file, length; a credential file also exactly one hard link)."
);

/// A saphan-core error on its way to Python. (A newtype because neither
/// `saphan_core::Error` nor `PyErr` is defined in this crate.)
#[derive(Debug)]
pub struct NativeError(Error);

impl NativeError {
    pub fn io(path: &Path, source: io::Error) -> Self {
        NativeError(Error::Io {
            path: path.to_owned(),
            source,
        })
    }
}

impl<E: Into<Error>> From<E> for NativeError {
    fn from(e: E) -> Self {
        NativeError(e.into())
    }
}

fn os_error(path: &Path, source: io::Error) -> PyErr {
    match source.raw_os_error() {
        Some(errno) => {
            // strerror text without the " (os error N)" suffix io::Error adds.
            let text = io::Error::from_raw_os_error(errno).to_string();
            let text = text
                .split_once(" (os error")
                .map_or(text.as_str(), |(head, _)| head)
                .to_owned();
            PyOSError::new_err((errno, text, path.display().to_string()))
        }
        None => PyErr::from(source),
    }
}

impl From<NativeError> for PyErr {
    fn from(e: NativeError) -> Self {
        match e.0 {
            Error::Policy(p) => PyValueError::new_err(p.to_string()),
            Error::KeyCustody(CoreKeyError::Io { path, source }) => os_error(&path, source),
            Error::KeyCustody(k) => KeyCustodyError::new_err(k.describe()),
            Error::Io { path, source } => os_error(&path, source),
            Error::BinaryCustody(BinaryCustodyError::Unmeasurable { path, source }) => {
                os_error(&path, source)
            }
            other => PyRuntimeError::new_err(other.to_string()),
        }
    }
}
