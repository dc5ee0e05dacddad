//! `reap --bridge 127.0.0.1:PORT=SOCKET`: the real binary carries a
//! command's TCP connections to a unix socket (the door), refuses before
//! the command starts when it cannot listen or cannot reach the door, never
//! hands the command its listener, and never outlives the command's run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// A port that was free a moment ago.
fn free_port() -> u16 {
    let probe = TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().port()
}

fn bridge_arg(port: u16, socket: &Path) -> String {
    format!("127.0.0.1:{port}={}", socket.display())
}

/// What an echo door received, one entry per connection.
type Received = Arc<Mutex<Vec<Vec<u8>>>>;

/// A door on `path`: every connection is read to its end (the client's
/// half-close, carried by the bridge), recorded, and answered `ok:` and
/// the bytes read.
fn echo_door(path: &Path) -> Received {
    let listener = UnixListener::bind(path).unwrap();
    let received: Received = Arc::default();
    let seen = Arc::clone(&received);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let seen = Arc::clone(&seen);
            std::thread::spawn(move || {
                let mut got = Vec::new();
                if conn.read_to_end(&mut got).is_err() {
                    return;
                }
                let _ = conn.write_all(&[b"ok:", &got[..]].concat());
                seen.lock().unwrap().push(got);
            });
        }
    });
    received
}

/// `reap --bridge SPEC -- python3 -c SCRIPT ARGS...`.
fn reap_python(spec: &str, script: &str, args: &[&str]) -> Output {
    let mut argv = vec!["reap", "--bridge", spec, "--", "python3", "-c", script];
    argv.extend(args);
    run(&argv)
}

const CLIENTS: &str = r#"
import socket, sys, threading
port, n = int(sys.argv[1]), int(sys.argv[2])
ok = []
def one(i):
    payload = bytes([i]) * (300 * 1024) + b"end %d" % i
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(payload)
    s.shutdown(socket.SHUT_WR)
    got = b"".join(iter(lambda: s.recv(65536), b""))
    ok.append(got == b"ok:" + payload)
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(sum(ok))
"#;

#[test]
fn the_bridge_carries_bytes_both_ways_to_the_unix_socket() {
    let tree = Tree::new();
    let door = tree.base.join("door.sock");
    let received = echo_door(&door);
    let port = free_port();
    let out = reap_python(&bridge_arg(port, &door), CLIENTS, &[&port.to_string(), "8"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "8\n", "{}", stderr(&out));
    assert!(
        stderr(&out).ends_with("saphan-launcher: exited code=0 reaped=0\n"),
        "{}",
        stderr(&out)
    );
    // The door saw every client's bytes whole, each on its own connection,
    // plus the empty connection of the launcher's check before the start.
    let mut got = received.lock().unwrap().clone();
    got.sort();
    let mut want: Vec<Vec<u8>> = (0..8u8)
        .map(|i| [vec![i; 300 * 1024], format!("end {i}").into_bytes()].concat())
        .collect();
    want.push(Vec::new());
    want.sort();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the door received other bytes");
}

#[test]
fn the_command_does_not_hold_the_bridges_listener() {
    let tree = Tree::new();
    let door = tree.base.join("door.sock");
    let _received = echo_door(&door);
    let port = free_port();
    // `$$` is the command itself (the launcher's direct child): its
    // descriptors are what it inherited across exec. It also shows the port
    // is listened on while it runs.
    let script = format!(
        "ls -l /proc/$$/fd; python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", \
         {port})); print(\"CONNECTED\")'"
    );
    let out = run(&[
        "reap",
        "--bridge",
        &bridge_arg(port, &door),
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let listing = stdout(&out);
    assert!(listing.contains("CONNECTED"), "{listing}");
    assert!(
        listing.contains("/proc/") || listing.contains("->"),
        "{listing}"
    );
    assert!(
        !listing.contains("socket:"),
        "the command inherited a socket:\n{listing}"
    );
}

/// The refusal both ways: exit 3, one line on the status descriptor, the
/// two lines on stderr, and the command never ran (it would have made
/// `marker`).
fn assert_refused_before_start(status: &Path, out: &Output, marker: &Path, starts: &str) {
    assert_eq!(code(out), 3, "{}", stderr(out));
    let lines: Vec<String> = std::fs::read_to_string(status)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let want = format!("saphan-launcher: refused [egress-uncuttable] {starts}");
    assert!(lines[0].starts_with(&want), "{lines:?}");
    let err = stderr(out);
    assert!(
        err.contains(&format!("refused [egress-uncuttable]: {starts}")),
        "{err}"
    );
    assert!(err.contains("\nfix: "), "{err}");
    assert!(!err.contains("exited code="), "{err}");
    assert!(!marker.exists(), "the command ran");
}

fn reap_touching(status: &Path, spec: &str, marker: &Path) -> Output {
    let touch = format!("touch {}", marker.display());
    run_with_status(
        status,
        &[
            "reap",
            "--status-fd",
            "5",
            "--bridge",
            spec,
            "--",
            "/bin/sh",
            "-c",
            &touch,
        ],
    )
}

#[test]
fn a_port_already_taken_is_refused_and_the_command_never_runs() {
    let tree = Tree::new();
    let door = tree.base.join("door.sock");
    let _received = echo_door(&door);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (status, marker) = (tree.base.join("status"), tree.base.join("ran"));
    let out = reap_touching(&status, &bridge_arg(port, &door), &marker);
    assert_refused_before_start(
        &status,
        &out,
        &marker,
        &format!("the egress bridge cannot listen on 127.0.0.1:{port}: "),
    );
    assert!(stderr(&out).contains("os error 98"), "{}", stderr(&out));
    drop(taken);
}

#[test]
fn a_door_that_cannot_be_connected_to_is_refused_and_the_command_never_runs() {
    let tree = Tree::new();
    let missing = tree.base.join("missing.sock");
    let file = tree.base.join("a-file.sock");
    std::fs::write(&file, b"not a socket").unwrap();
    // A socket whose listener is gone: the path is there, nobody answers.
    let dead = tree.base.join("dead.sock");
    drop(UnixListener::bind(&dead).unwrap());
    for door in [missing, file, dead] {
        let (status, marker) = (tree.base.join("status"), tree.base.join("ran"));
        let out = reap_touching(&status, &bridge_arg(free_port(), &door), &marker);
        assert_refused_before_start(
            &status,
            &out,
            &marker,
            &format!(
                "the egress bridge cannot connect to the door's unix socket {}: ",
                door.display()
            ),
        );
    }
}

#[test]
fn a_door_gone_after_the_start_closes_the_clients_connection() {
    let tree = Tree::new();
    let door = tree.base.join("door.sock");
    let gone = tree.base.join("door-gone");
    let listener = UnixListener::bind(&door).unwrap();
    let (door_path, gone_marker) = (door.clone(), gone.clone());
    std::thread::spawn(move || {
        // The launcher's check, then the door goes away.
        drop(listener.accept().unwrap());
        drop(listener);
        std::fs::remove_file(&door_path).unwrap();
        std::fs::write(&gone_marker, b"").unwrap();
    });
    let script = r#"
import os, socket, sys, time
port, gone = int(sys.argv[1]), sys.argv[2]
deadline = time.time() + 10
while not os.path.exists(gone) and time.time() < deadline:
    time.sleep(0.02)
s = socket.create_connection(("127.0.0.1", port))
s.settimeout(10)
try:
    s.sendall(b"hello")
    got = s.recv(100)
except (ConnectionResetError, BrokenPipeError):
    got = b""
print("closed" if got == b"" else "got %r" % got)
"#;
    let port = free_port();
    let out = reap_python(
        &bridge_arg(port, &door),
        script,
        &[&port.to_string(), gone.to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "closed\n", "{}", stderr(&out));
}

#[test]
fn open_connections_do_not_keep_the_launcher_alive() {
    let tree = Tree::new();
    let door = tree.base.join("door.sock");
    // A door that takes every connection and never answers nor closes.
    let listener = UnixListener::bind(&door).unwrap();
    let held: Arc<Mutex<Vec<UnixStream>>> = Arc::default();
    let keep = Arc::clone(&held);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            keep.lock().unwrap().push(conn);
        }
    });
    let port = free_port();
    // A left-behind process holds a connection open, the command holds
    // another when it exits.
    let holder = format!(
        "import socket, time; s = socket.create_connection((\"127.0.0.1\", {port})); \
         s.sendall(b\"x\"); time.sleep(600)"
    );
    let command = format!(
        "import socket, subprocess, time\n\
         subprocess.Popen([\"python3\", \"-c\", {holder:?}], start_new_session=True)\n\
         s = socket.create_connection((\"127.0.0.1\", {port}))\n\
         s.sendall(b\"y\")\n\
         time.sleep(1)\n\
         raise SystemExit(7)\n"
    );
    let started = Instant::now();
    let out = reap_python(&bridge_arg(port, &door), &command, &[]);
    let took = started.elapsed();
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert!(
        stderr(&out).ends_with("saphan-launcher: exited code=7 reaped=1\n"),
        "{}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(8), "took {took:?}");
    // The check's connection and the two clients' reached the door.
    assert_eq!(held.lock().unwrap().len(), 3);
}

#[test]
fn exec_does_not_take_a_bridge() {
    let tree = Tree::new();
    let door: PathBuf = tree.base.join("door.sock");
    let out = run(&[
        "exec",
        "--policy",
        &tree.policy(),
        "--bridge",
        &bridge_arg(free_port(), &door),
        "--",
        "/bin/true",
    ]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("`--bridge` is a `reap` option, `exec` does not take it"),
        "{}",
        stderr(&out)
    );
}
