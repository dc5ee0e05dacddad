//! Streaming SHA-256 (the `sha2` crate, which selects the CPU's SHA
//! extensions at run time when it has them).
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Read buffer size: large enough that syscalls do not dominate.
const BUF_LEN: usize = 256 * 1024;

/// Lowercase hex of a byte string.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

/// SHA-256 of everything `reader` yields, as 64 lowercase hex digits.
pub fn sha256_reader<R: Read>(mut reader: R) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUF_LEN];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(hex(&hasher.finalize()))
}

/// SHA-256 of the file at `path` (symbolic links followed).
pub fn sha256_file(path: &Path) -> io::Result<String> {
    sha256_reader(File::open(path)?)
}

/// Whether `s` is a SHA-256 digest as saphan writes one: exactly 64
/// lowercase hex digits (what [`hex`] produces for 32 bytes).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Why [`verify_sha256_file`] did not confirm a file.
#[derive(Debug)]
pub enum VerifyError {
    /// The file could not be opened or read, so it cannot be verified.
    Unreadable(io::Error),
    /// The file was read whole and has another digest.
    Mismatch {
        /// The digest of what was read.
        actual: String,
    },
}

/// Hashes the file at `path` and compares the digest with `expected` (64
/// lowercase hex digits); returns the digest when they are equal. A file
/// that cannot be read is an error of its own kind: never a match.
pub fn verify_sha256_file(path: &Path, expected: &str) -> Result<String, VerifyError> {
    let actual = sha256_file(path).map_err(VerifyError::Unreadable)?;
    if constant_time_eq(actual.as_bytes(), expected.as_bytes()) {
        Ok(actual)
    } else {
        Err(VerifyError::Mismatch { actual })
    }
}

/// SHA-256 of an in-memory byte string.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// HMAC-SHA256 (RFC 2104) of `data` under `key`, as 64 lowercase hex digits:
/// what signs run records and machine rows with the workspace key.
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> String {
    const BLOCK: usize = 64;
    let mut block_key = [0u8; BLOCK];
    if key.len() > BLOCK {
        let hashed = Sha256::digest(key);
        block_key[..hashed.len()].copy_from_slice(&hashed);
    } else {
        block_key[..key.len()].copy_from_slice(key);
    }
    let ipad: Vec<u8> = block_key.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = block_key.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new()
        .chain_update(&ipad)
        .chain_update(data)
        .finalize();
    hex(&Sha256::new()
        .chain_update(&opad)
        .chain_update(inner)
        .finalize())
}

/// Whether two byte strings are equal, in time that depends only on their
/// lengths (a signature check must not say how much of a guess was right).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn hmac_rfc4231_vectors() {
        assert_eq!(
            hmac_sha256(&[0x0b; 20], b"Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hmac_sha256(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            ),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn constant_time_eq_compares_whole_strings() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn known_vectors() {
        assert_eq!(sha256_bytes(b""), EMPTY);
        assert_eq!(sha256_bytes(b"abc"), ABC);
        assert_eq!(
            sha256_bytes(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn file_digest_streams_across_buffer_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // Not a multiple of the buffer, spanning several reads.
        let data: Vec<u8> = (0..(BUF_LEN * 3 + 12345))
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        assert_eq!(sha256_file(&path).unwrap(), sha256_bytes(&data));
        std::fs::write(&path, b"").unwrap();
        assert_eq!(sha256_file(&path).unwrap(), EMPTY);
    }

    #[test]
    fn missing_file_is_an_io_error() {
        let err = sha256_file(Path::new("/nonexistent/saphan/file")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn sha256_hex_is_64_lowercase_hex_digits() {
        assert!(is_sha256_hex(EMPTY));
        assert!(is_sha256_hex(&"0".repeat(64)));
        for bad in [
            String::new(),
            EMPTY[..63].to_owned(),
            format!("{EMPTY}0"),
            EMPTY.to_uppercase(),
            format!("{}g", &EMPTY[..63]),
            format!(" {}", &EMPTY[..63]),
            format!("{}\n", &EMPTY[..63]),
            format!("0x{}", &EMPTY[..62]),
            // 64 bytes, but not 64 ASCII digits.
            format!("{}é", &EMPTY[..62]),
        ] {
            assert!(!is_sha256_hex(&bad), "{bad:?}");
        }
    }

    #[test]
    fn verify_confirms_only_the_file_with_that_digest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(verify_sha256_file(&path, ABC).unwrap(), ABC);
        match verify_sha256_file(&path, EMPTY) {
            Err(VerifyError::Mismatch { actual }) => assert_eq!(actual, ABC),
            other => panic!("{other:?}"),
        }
        // An uppercase spelling of the right digest is not the digest.
        assert!(matches!(
            verify_sha256_file(&path, &ABC.to_uppercase()),
            Err(VerifyError::Mismatch { .. })
        ));
        std::fs::remove_file(&path).unwrap();
        match verify_sha256_file(&path, ABC) {
            Err(VerifyError::Unreadable(e)) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn verify_reads_the_running_executable() {
        // /proc/self/exe is the inode this test process runs from.
        let exe = Path::new("/proc/self/exe");
        let digest = sha256_file(exe).unwrap();
        assert!(is_sha256_hex(&digest));
        assert_eq!(verify_sha256_file(exe, &digest).unwrap(), digest);
        assert!(matches!(
            verify_sha256_file(exe, EMPTY),
            Err(VerifyError::Mismatch { actual }) if actual == digest
        ));
    }

    #[test]
    fn hex_is_lowercase_and_padded() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }
}
