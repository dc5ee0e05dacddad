//! The `--stdin-frame` frame: what saphan hands a far run over the SSH
//! channel's stdin (secrets and the command's stdin), never on a command
//! line, in a file, or in the launcher's own environment; and the lifeline,
//! the rest of that stdin once the frame has ended.
//!
//! ```text
//! saphan-frame 1\n                 the magic line
//! keep NAME\n                      NAME with the launcher's own value, if it has one
//! env NAME LEN\n<LEN bytes>        NAME=<those bytes> (no NUL among them)
//! stdin LEN\n<LEN bytes>           the command's stdin (at most one item)
//! end\n                            the end of the frame
//! ```
//!
//! Items come in any order, zero or more of them. Fields are separated by
//! exactly one space, nothing trails a header. Rules:
//! * a header line is at most [`MAX_HEADER`] bytes (its `\n` included);
//! * NAME matches `^[A-Za-z_][A-Za-z0-9_]*$`, is at most [`MAX_NAME`] bytes,
//!   and is named once (by `keep` or by `env`); under `exec` it is not
//!   `TMPDIR`, which the launcher sets itself (checked by `launch`; `reap`
//!   takes it from the frame: a supervised run's scratch directory);
//! * LEN is decimal digits only (no sign, no `+`); an env value is at most
//!   [`MAX_ENV_VALUE`] bytes, a stdin payload at most [`MAX_STDIN`];
//! * end of input before `end\n` is an error.
//!
//! The reader is never read past `end\n`: header lines are read one byte at
//! a time and payloads with `read_exact`, so whatever follows the frame is
//! left for the lifeline ([`watch_lifeline`]). The parser is pure over
//! `impl Read`; the launcher gives it a duplicate of fd 0 (a plain `File`,
//! never std's buffered `Stdin`, which would read ahead).
//!
//! An error names the item (its number and, once validated, its kind and
//! NAME) and what is wrong, never a payload byte, nor any text of a header
//! that did not parse (a LEN that was too small makes the rest of a value
//! read as a header line, and that text is secret).
//!
//! Secrets hygiene (best effort): payloads are held in [`Secret`], which
//! overwrites its bytes with zeros when dropped, and the buffers are
//! allocated at their final size before they are read into, so no copy is
//! left behind by a reallocation. Copies made elsewhere are out of reach:
//! std's `Command` keeps its own copy of each variable until it is dropped
//! (freed, not zeroed), the kernel copies them into the command.
#![forbid(unsafe_code)]

use saphan_core::process;
use std::fmt;
use std::io::{self, Read};

/// The first line of every frame.
pub const MAGIC: &[u8] = b"saphan-frame 1\n";
/// The longest header line, its `\n` included.
pub const MAX_HEADER: usize = 512;
/// The longest NAME.
pub const MAX_NAME: usize = 255;
/// The largest env value (1 MiB).
pub const MAX_ENV_VALUE: usize = 1 << 20;
/// The largest stdin payload (16 MiB).
pub const MAX_STDIN: usize = 16 << 20;
/// The longest lifeline line looked at; a longer one is discarded.
pub const MAX_LIFELINE_LINE: usize = 1024;

/// Bytes that are zeroed when dropped (best effort: `fill(0)` behind a
/// `black_box`, so the write is not optimised away as dead). Its `Debug`
/// shows the length only.
#[derive(PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Overwrites the bytes with zeros (the length stays).
    pub fn wipe(&mut self) {
        self.0.fill(0);
        std::hint::black_box(&mut self.0);
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.wipe();
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// A parsed frame.
#[derive(Debug, Default)]
pub struct Frame {
    /// The names the command gets with the launcher's own values.
    pub keep: Vec<String>,
    /// The variables the command gets, in frame order.
    pub env: Vec<(String, Secret)>,
    /// The command's stdin (`None`: /dev/null).
    pub stdin: Option<Secret>,
}

/// Why a frame was refused (no payload byte in it).
#[derive(Debug, PartialEq, Eq)]
pub struct FrameError(pub String);

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, FrameError> {
    Err(FrameError(msg.into()))
}

/// Reads one header line, one byte at a time, never past its `\n`.
/// `Ok(None)`: end of input before any byte.
fn read_line(r: &mut impl Read, what: &str) -> Result<Option<Vec<u8>>, FrameError> {
    let mut line = Vec::with_capacity(MAX_HEADER);
    let mut byte = [0u8; 1];
    loop {
        match r.read(&mut byte) {
            Ok(0) if line.is_empty() => return Ok(None),
            Ok(0) => return err(format!("{what}: end of input inside the header line")),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return err(format!("{what}: cannot read the header line: {e}")),
        }
        if byte[0] == b'\n' {
            return Ok(Some(line));
        }
        if line.len() + 1 >= MAX_HEADER {
            return err(format!(
                "{what}: the header line is longer than {MAX_HEADER} bytes"
            ));
        }
        line.push(byte[0]);
    }
}

fn check_name(name: &str, what: &str) -> Result<(), FrameError> {
    let b = name.as_bytes();
    let ok_first = b
        .first()
        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_');
    let ok_rest = b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if !ok_first || !ok_rest {
        return err(format!(
            "{what}: the NAME is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
        ));
    }
    if b.len() > MAX_NAME {
        return err(format!("{what}: the NAME is longer than {MAX_NAME} bytes"));
    }
    Ok(())
}

impl Frame {
    /// Whether the frame names `name` (by `keep` or by `env`).
    pub fn names(&self, name: &str) -> bool {
        self.keep.iter().any(|k| k == name) || self.env.iter().any(|(k, _)| k == name)
    }
}

fn parse_len(field: &str, max: usize, what: &str) -> Result<usize, FrameError> {
    if field.is_empty() || !field.bytes().all(|c| c.is_ascii_digit()) {
        return err(format!("{what}: LEN is not a decimal number (digits only)"));
    }
    match field.parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        _ => err(format!("{what}: LEN is over the limit of {max} bytes")),
    }
}

fn read_payload(r: &mut impl Read, len: usize, what: &str) -> Result<Secret, FrameError> {
    let mut buf = Secret(vec![0u8; len]);
    match r.read_exact(&mut buf.0) {
        Ok(()) => Ok(buf),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => err(format!(
            "{what}: end of input inside the {len}-byte payload"
        )),
        Err(e) => err(format!("{what}: cannot read the payload: {e}")),
    }
}

/// Reads one frame from `r`, leaving `r` exactly after its `end\n`.
pub fn read_frame(r: &mut impl Read) -> Result<Frame, FrameError> {
    let mut magic = [0u8; MAGIC.len()];
    let mut got = 0;
    while got < magic.len() {
        match r.read(&mut magic[got..got + 1]) {
            Ok(0) => return err("end of input before the `saphan-frame 1` line"),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return err(format!("cannot read the `saphan-frame 1` line: {e}")),
        }
        if magic[got] != MAGIC[got] {
            return err("the frame does not start with the line `saphan-frame 1`");
        }
        got += 1;
    }

    let mut frame = Frame::default();
    let mut names: Vec<String> = Vec::new();
    let mut item = 0usize;
    loop {
        item += 1;
        let at = format!("item {item}");
        let Some(line) = read_line(r, &at)? else {
            return err(format!("{at}: end of input before the `end` line"));
        };
        let Ok(line) = String::from_utf8(line) else {
            return err(format!("{at}: the header line is not ASCII"));
        };
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["end"] => return Ok(frame),
            ["keep", name] => {
                let what = format!("{at} (keep)");
                check_name(name, &what)?;
                remember(&mut names, name, &what)?;
                frame.keep.push((*name).to_owned());
            }
            ["env", name, len] => {
                let what = format!("{at} (env)");
                check_name(name, &what)?;
                let what = format!("{at} (env {name})");
                let len = parse_len(len, MAX_ENV_VALUE, &what)?;
                remember(&mut names, name, &what)?;
                let value = read_payload(r, len, &what)?;
                if value.0.contains(&0) {
                    return err(format!("{what}: the value contains a NUL byte"));
                }
                frame.env.push(((*name).to_owned(), value));
            }
            ["stdin", len] => {
                let what = format!("{at} (stdin)");
                if frame.stdin.is_some() {
                    return err(format!("{what}: a second stdin item (at most one)"));
                }
                let len = parse_len(len, MAX_STDIN, &what)?;
                frame.stdin = Some(read_payload(r, len, &what)?);
            }
            [kind @ ("end" | "keep" | "env" | "stdin"), ..] => {
                return err(format!(
                    "{at} ({kind}): the header has the wrong number of fields (one space \
                     between fields, nothing after the last)"
                ));
            }
            _ => {
                return err(format!(
                    "{at}: not a header (keep NAME, env NAME LEN, stdin LEN or end)"
                ));
            }
        }
    }
}

fn remember(names: &mut Vec<String>, name: &str, what: &str) -> Result<(), FrameError> {
    if names.iter().any(|n| n == name) {
        return err(format!("{what}: {name} is named twice in the frame"));
    }
    names.push(name.to_owned());
    Ok(())
}

/// The lifeline: reads `r` line by line until end of input or an error,
/// and calls `stop` for every line that is exactly `stop` (`\n`
/// terminated; a last line without `\n` is not a line). Lines longer than
/// [`MAX_LIFELINE_LINE`] are discarded. Returns how many `stop` lines it
/// saw.
pub fn watch_lifeline(r: impl Read, mut stop: impl FnMut()) -> usize {
    let mut stops = 0;
    watch_lines(r, |line| {
        if line == b"stop" {
            stops += 1;
            stop();
        }
    });
    stops
}

/// What the local lifeline (`--lifeline-fd`) asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// `signal TERM|INT|HUP`: pass that signal (its number) to the command.
    Signal(i32),
    /// `signal KILL`: kill the command.
    Kill,
    /// End of input, or a read error: the caller is gone, or ended the run.
    End,
}

/// The local lifeline: reads `r` line by line (as [`watch_lifeline`]),
/// calls `on` for each exact `signal NAME` line it knows (others are
/// ignored), and once with [`Control::End`] when the input ends.
pub fn watch_control(r: impl Read, mut on: impl FnMut(Control)) {
    watch_lines(r, |line| {
        let control = match line {
            b"signal TERM" => Control::Signal(process::SIGTERM),
            b"signal INT" => Control::Signal(process::SIGINT),
            b"signal HUP" => Control::Signal(process::SIGHUP),
            b"signal KILL" => Control::Kill,
            _ => return,
        };
        on(control);
    });
    on(Control::End);
}

/// Calls `line` with every `\n`-terminated line of `r` (without the
/// `\n`) until end of input or a read error; a line longer than
/// [`MAX_LIFELINE_LINE`] is discarded whole.
fn watch_lines(mut r: impl Read, mut line_of: impl FnMut(&[u8])) {
    let mut chunk = [0u8; 4096];
    let mut line: Vec<u8> = Vec::with_capacity(MAX_LIFELINE_LINE);
    let mut overlong = false;
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        for &b in &chunk[..n] {
            if b == b'\n' {
                if !overlong {
                    line_of(&line);
                }
                line.clear();
                overlong = false;
            } else if overlong {
            } else if line.len() >= MAX_LIFELINE_LINE {
                line.clear();
                overlong = true;
            } else {
                line.push(b);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::Cursor;

    const SECRET: &str = "hunter2-very-secret";

    fn parse(bytes: &[u8]) -> (Result<Frame, FrameError>, u64) {
        let mut c = Cursor::new(bytes.to_vec());
        let r = read_frame(&mut c);
        (r, c.position())
    }

    fn env_item(name: &str, value: &[u8]) -> Vec<u8> {
        let mut v = format!("env {name} {}\n", value.len()).into_bytes();
        v.extend_from_slice(value);
        v
    }

    fn frame(items: &[&[u8]]) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        for i in items {
            v.extend_from_slice(i);
        }
        v.extend_from_slice(b"end\n");
        v
    }

    #[test]
    fn a_good_frame_is_parsed_and_the_reader_stops_right_after_end() {
        let stdin = b"line one\nend\nstop\n\0binary".to_vec();
        let mut bytes = frame(&[
            b"keep PATH\n",
            &env_item("API_KEY", SECRET.as_bytes()),
            &env_item("EMPTY", b""),
            b"keep _under_2\n",
            &[format!("stdin {}\n", stdin.len()).as_bytes(), &stdin].concat(),
            &env_item("MULTI", b"a b\nc=d end\n"),
        ]);
        let end = bytes.len() as u64;
        bytes.extend_from_slice(b"stop\nmore");
        let (r, pos) = parse(&bytes);
        let f = r.unwrap();
        assert_eq!(pos, end, "the reader must stop exactly after `end\\n`");
        assert_eq!(&bytes[pos as usize..], b"stop\nmore");
        assert_eq!(f.keep, vec!["PATH".to_owned(), "_under_2".to_owned()]);
        let env: Vec<(&str, &[u8])> = f.env.iter().map(|(n, v)| (n.as_str(), v.bytes())).collect();
        assert_eq!(
            env,
            vec![
                ("API_KEY", SECRET.as_bytes()),
                ("EMPTY", &b""[..]),
                ("MULTI", &b"a b\nc=d end\n"[..]),
            ]
        );
        assert_eq!(f.stdin.as_ref().unwrap().bytes(), &stdin[..]);
        assert!(!format!("{f:?}").contains(SECRET), "Debug shows no value");
    }

    #[test]
    fn an_empty_frame_and_leading_zeros_are_fine() {
        let (r, pos) = parse(b"saphan-frame 1\nend\nstop\n");
        let f = r.unwrap();
        assert_eq!(pos, 19);
        assert!(f.keep.is_empty() && f.env.is_empty() && f.stdin.is_none());
        let (r, _) = parse(b"saphan-frame 1\nenv A 003\nabcend\n");
        assert_eq!(r.unwrap().env[0].1.bytes(), b"abc");
    }

    /// Each bad frame, and a word its error must contain. None of the
    /// messages may contain the secret (or a piece of it).
    #[test]
    fn every_error_is_named_and_carries_no_value() {
        let big_env = format!("env BIG {}\n", MAX_ENV_VALUE + 1);
        let big_stdin = format!("stdin {}\n", MAX_STDIN + 1);
        let long_name = format!("keep {}\n", "N".repeat(MAX_NAME + 1));
        let long_header = format!("keep {}\n", "N".repeat(MAX_HEADER));
        let mut nul = SECRET.as_bytes().to_vec();
        nul.insert(6, 0);
        let secret_header = format!("{SECRET}\n");
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"".to_vec(), "saphan-frame 1"),
            (b"saphan-frame 2\nend\n".to_vec(), "saphan-frame 1"),
            (format!("{SECRET}\n").into_bytes(), "saphan-frame 1"),
            (b"saphan-frame 1\n".to_vec(), "end"),
            (b"saphan-frame 1\nkeep A".to_vec(), "end of input"),
            (frame(&[b"keep 1A\n"]), "NAME"),
            (frame(&[b"keep A-B\n"]), "NAME"),
            (frame(&[b"keep \n"]), "NAME"),
            (frame(&[long_name.as_bytes()]), "longer than 255"),
            (frame(&[long_header.as_bytes()]), "longer than 512"),
            (frame(&[b"keep A\n", b"keep A\n"]), "twice"),
            (
                frame(&[b"keep A\n", &env_item("A", SECRET.as_bytes())]),
                "twice",
            ),
            (
                frame(&[&env_item("A", SECRET.as_bytes()), b"keep A\n"]),
                "twice",
            ),
            (frame(&[big_env.as_bytes()]), "limit"),
            (frame(&[big_stdin.as_bytes()]), "limit"),
            (frame(&[b"env A 99999999999999999999999999\n"]), "limit"),
            (frame(&[b"env A +3\nabc"]), "digits only"),
            (frame(&[b"env A -3\nabc"]), "digits only"),
            (frame(&[b"env A 3 \nabc"]), "fields"),
            (frame(&[b"env A\n"]), "fields"),
            (frame(&[b"stdin \n"]), "digits only"),
            (frame(&[b"keep  A\n"]), "fields"),
            (frame(&[b"end \n"]), "fields"),
            (frame(&[&env_item("A", &nul)]), "NUL"),
            (
                frame(&[b"stdin 1\nx", &[b"stdin 6\n", SECRET.as_bytes()].concat()]),
                "second stdin",
            ),
            (
                [
                    MAGIC,
                    format!("env A {}\n", SECRET.len() + 5).as_bytes(),
                    SECRET.as_bytes(),
                ]
                .concat(),
                "end of input inside the",
            ),
            (
                [MAGIC, b"stdin 100\n", SECRET.as_bytes()].concat(),
                "end of input inside the 100-byte payload",
            ),
            // A LEN too small: the rest of the value is read as a header.
            (
                frame(&[b"env A 3\n", secret_header.as_bytes()]),
                "not a header",
            ),
            (frame(&[b"nonsense\n"]), "not a header"),
            (frame(&[b"ke\xffep A\n"]), "not ASCII"),
        ];
        for (bytes, word) in cases {
            let e = parse(&bytes).0.unwrap_err();
            assert!(e.0.contains(word), "{:?}: {e:?} lacks {word:?}", bytes);
            for piece in [SECRET, &SECRET[3..], &SECRET[..6], "hunter"] {
                assert!(!e.0.contains(piece), "{e:?} leaks {piece:?}");
            }
        }
    }

    #[test]
    fn an_error_names_the_item() {
        let e = parse(&frame(&[b"keep A\n", &env_item("B", b"\0")]))
            .0
            .unwrap_err();
        assert!(e.0.starts_with("item 2 (env B)"), "{e:?}");
        let e = parse(&frame(&[b"keep A\n", b"keep A\n"])).0.unwrap_err();
        assert!(e.0.starts_with("item 2 (keep)"), "{e:?}");
    }

    #[test]
    fn a_header_is_read_one_byte_at_a_time() {
        /// Fails the test if asked for more than one byte while a header
        /// is being read (the frame has no payload).
        struct OneByte<'a>(&'a [u8], usize);
        impl Read for OneByte<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                assert_eq!(buf.len(), 1, "a header read asked for {} bytes", buf.len());
                let Some(b) = self.0.get(self.1) else {
                    return Ok(0);
                };
                buf[0] = *b;
                self.1 += 1;
                Ok(1)
            }
        }
        let bytes = b"saphan-frame 1\nkeep A\nend\nstop\n";
        let mut r = OneByte(bytes, 0);
        read_frame(&mut r).unwrap();
        assert_eq!(&bytes[r.1..], b"stop\n");
    }

    #[test]
    fn a_secret_is_wiped_in_place() {
        let mut s = Secret(SECRET.as_bytes().to_vec());
        s.wipe();
        assert_eq!(s.bytes(), vec![0u8; SECRET.len()].as_slice());
        assert_eq!(format!("{s:?}"), format!("Secret({} bytes)", SECRET.len()));
    }

    #[test]
    fn the_local_lifeline_knows_four_signal_lines_then_the_end() {
        let input = b"signal TERM\nsignal term\nsignal INT\n signal HUP\nsignal HUP\n\
                      signal KILL\nsignal STOP\nstop\nsignal TERM"
            .to_vec();
        let mut seen = Vec::new();
        watch_control(Cursor::new(input), |c| seen.push(c));
        assert_eq!(
            seen,
            vec![
                Control::Signal(process::SIGTERM),
                Control::Signal(process::SIGINT),
                Control::Signal(process::SIGHUP),
                Control::Kill,
                Control::End,
            ]
        );
        let mut ended = Vec::new();
        watch_control(Cursor::new(Vec::new()), |c| ended.push(c));
        assert_eq!(ended, vec![Control::End]);
    }

    #[test]
    fn the_lifeline_counts_exact_stop_lines_only() {
        let long = format!("{}stop\n", "x".repeat(MAX_LIFELINE_LINE * 3));
        let input = [
            b"hello\nstop\n stop\nstop \nSTOP\nstopstop\n".to_vec(),
            long.into_bytes(),
            b"stop\r\n\nstop\nstop".to_vec(),
        ]
        .concat();
        let mut seen = 0;
        let n = watch_lifeline(Cursor::new(input), || seen += 1);
        assert_eq!((n, seen), (2, 2));
        assert_eq!(watch_lifeline(Cursor::new(b"".to_vec()), || {}), 0);

        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::from(io::ErrorKind::BrokenPipe))
            }
        }
        assert_eq!(watch_lifeline(Broken, || panic!("no stop")), 0);
    }
}
