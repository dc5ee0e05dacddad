//! `reap --bridge 127.0.0.1:PORT=SOCKET`: a TCP port on the jail's loopback
//! carried to a unix socket.
//!
//! A run with an egress policy has a network namespace of its own holding
//! only loopback; its one way out is saphan's proxy (the door), served
//! outside the jail on a unix socket bound into it. Ordinary HTTP clients
//! (curl, Node, reqwest) speak TCP to a proxy, not a unix socket, so the
//! jail's first process listens on `127.0.0.1:PORT` and carries each
//! accepted connection, byte for byte both ways, to a fresh connection to
//! SOCKET. The bridge reads nothing of what it carries: the door
//! authenticates and filters.
//!
//! Why it is shaped this way:
//! * [`Bridge::open`] runs before the command starts: a port that cannot be
//!   listened on, or a door that cannot be reached, is refused
//!   (`egress-uncuttable`) and nothing runs, rather than a run that could
//!   never get out and fails somewhere inside an agent;
//! * the listener and every stream are close-on-exec (std's default, kept):
//!   the command never holds the listener, so it cannot accept the bridge's
//!   connections itself, nor keep the port after its launcher is gone;
//! * [`Bridge::start`] runs after the spawn, from the supervisor's thread
//!   once its signals are blocked: every bridge thread inherits that mask,
//!   so a signal meant for the supervisor is never taken (with its default,
//!   fatal disposition) by a bridge thread;
//! * no thread is ever joined: the launcher exits when the command's run
//!   ends, and the bridge ends with it, whatever connections are open;
//! * each direction is one thread with a 256 KiB buffer on the heap (small
//!   stacks, so [`MAX_LIVE`] connections cost little); one direction's end
//!   of input becomes a `shutdown(Write)` on the other side, so a client's
//!   half-close reaches the door and back; any error ends the connection
//!   both ways.
#![forbid(unsafe_code)]

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::cli::BridgeSpec;
use crate::refusal::Refusal;

/// Connections carried at once; one more is closed as soon as it is
/// accepted (a client that opens connections without end cannot exhaust
/// the launcher's threads or descriptors, which the supervisor needs).
pub const MAX_LIVE: usize = 256;

/// Each direction's copy buffer. Big enough that a bulk transfer moves in
/// few system calls: measured on 100 MB through the bridge, 256 KiB runs at
/// about plain loopback's speed, 64 KiB at about two thirds of it. Two per
/// connection: at most 128 MiB for [`MAX_LIVE`] bulk transfers at once (a
/// connection carrying small requests mostly touches far fewer pages).
const BUFFER: usize = 256 * 1024;

/// A bridge thread's stack: the buffer lives on the heap, and the threads
/// only copy.
const STACK: usize = 128 * 1024;

/// How long the accept loop pauses after a failed accept (out of
/// descriptors, say), so it never spins.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// A bridge that is listening and has reached its door once.
pub struct Bridge {
    listener: TcpListener,
    socket: Arc<PathBuf>,
}

impl Bridge {
    /// Listens on `127.0.0.1:PORT`, then connects once to the socket (and
    /// drops the connection): both must work before the command starts.
    pub fn open(spec: &BridgeSpec) -> Result<Bridge, Refusal> {
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, spec.port);
        let listener =
            TcpListener::bind(addr).map_err(|e| Refusal::bridge_cannot_listen(addr, &e))?;
        UnixStream::connect(&spec.socket)
            .map_err(|e| Refusal::bridge_door_unreachable(&spec.socket, &e))?;
        Ok(Bridge {
            listener,
            socket: Arc::new(spec.socket.clone()),
        })
    }

    /// Starts the accept thread (never joined). On an error the bridge is
    /// dropped: the port is closed, so a client is refused at once rather
    /// than left waiting.
    pub fn start(self) -> io::Result<()> {
        thread::Builder::new()
            .name("bridge-accept".to_owned())
            .stack_size(STACK)
            .spawn(move || self.serve())
            .map(drop)
    }

    fn serve(self) {
        let live = Arc::new(AtomicUsize::new(0));
        loop {
            match self.listener.accept() {
                Ok((tcp, _)) => admit(tcp, &self.socket, &live),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => thread::sleep(ACCEPT_PAUSE),
            }
        }
    }
}

/// One live connection, counted until both of its directions have ended
/// (the last holder of the `Arc<Slot>` drops it).
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// A slot, or `None` when [`MAX_LIVE`] connections are live.
    fn take(live: &Arc<AtomicUsize>) -> Option<Slot> {
        live.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_LIVE).then_some(n + 1)
        })
        .ok()
        .map(|_| Slot(Arc::clone(live)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Carries `tcp` from a thread of its own, or closes it (no slot free, or
/// no thread to be had: dropping the closure closes the stream).
fn admit(tcp: TcpStream, socket: &Arc<PathBuf>, live: &Arc<AtomicUsize>) {
    let Some(slot) = Slot::take(live) else {
        return;
    };
    let socket = Arc::clone(socket);
    let _ = thread::Builder::new()
        .name("bridge-conn".to_owned())
        .stack_size(STACK)
        .spawn(move || carry(tcp, &socket, slot));
}

/// Connects to the door and copies both ways: the client's bytes from a
/// second thread, the door's on this one. A door that cannot be reached
/// closes the client's connection.
fn carry(tcp: TcpStream, socket: &Path, slot: Slot) {
    let Ok(unix) = UnixStream::connect(socket) else {
        return;
    };
    // A proxy's small writes (TLS handshakes) must not wait on Nagle.
    let _ = tcp.set_nodelay(true);
    let (Ok(tcp_in), Ok(unix_out)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let slot = Arc::new(slot);
    let upstream_slot = Arc::clone(&slot);
    let upstream = thread::Builder::new()
        .name("bridge-up".to_owned())
        .stack_size(STACK)
        .spawn(move || {
            pump(tcp_in, unix_out);
            drop(upstream_slot);
        });
    if upstream.is_ok() {
        pump(unix, tcp);
    }
    drop(slot);
}

/// The shutdown both socket kinds have, so [`pump`] serves either direction.
trait Socket: Read + Write {
    fn shut(&self, how: Shutdown) -> io::Result<()>;
}

impl Socket for TcpStream {
    fn shut(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
}

impl Socket for UnixStream {
    fn shut(&self, how: Shutdown) -> io::Result<()> {
        self.shutdown(how)
    }
}

/// One direction: `from` to `to` until `from`'s end of input, which is then
/// passed on as `to`'s half-close. An error shuts both sockets down both
/// ways, which also wakes the other direction's thread: the connection ends.
fn pump(mut from: impl Socket, mut to: impl Socket) {
    match copy(&mut from, &mut to) {
        Ok(()) => {
            let _ = to.shut(Shutdown::Write);
        }
        Err(_) => {
            let _ = from.shut(Shutdown::Both);
            let _ = to.shut(Shutdown::Both);
        }
    }
}

/// `io::copy` with a [`BUFFER`]-sized buffer (std's generic copy between
/// two sockets uses 8 KiB).
fn copy(from: &mut impl Read, to: &mut impl Write) -> io::Result<()> {
    let mut buf = vec![0u8; BUFFER];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => to.write_all(&buf[..n])?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_live_slots_are_taken_and_a_dropped_one_is_free_again() {
        let live = Arc::new(AtomicUsize::new(0));
        let mut held: Vec<Slot> = (0..MAX_LIVE).map(|_| Slot::take(&live).unwrap()).collect();
        assert_eq!(live.load(Ordering::Acquire), MAX_LIVE);
        assert!(Slot::take(&live).is_none());
        assert_eq!(live.load(Ordering::Acquire), MAX_LIVE);
        held.pop();
        assert_eq!(live.load(Ordering::Acquire), MAX_LIVE - 1);
        held.push(Slot::take(&live).unwrap());
        assert!(Slot::take(&live).is_none());
        held.clear();
        assert_eq!(live.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_half_close_passes_through_and_the_reply_comes_back() {
        // client <-> (tcp) bridge (unix) <-> door, in one process.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("door.sock");
        let door = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let bridge = Bridge::open(&BridgeSpec {
            port,
            socket: path.clone(),
        })
        .unwrap();
        drop(door.accept().unwrap()); // the check `open` made
        bridge.start().unwrap();

        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let payload: Vec<u8> = (0..3 * BUFFER + 17).map(|i| (i % 251) as u8).collect();
        client.write_all(&payload).unwrap();
        client.shutdown(Shutdown::Write).unwrap();

        let (mut far, _) = door.accept().unwrap();
        let mut got = Vec::new();
        far.read_to_end(&mut got).unwrap(); // ends only on the half-close
        assert_eq!(got, payload);
        far.write_all(b"reply").unwrap();
        drop(far);

        let mut back = Vec::new();
        client.read_to_end(&mut back).unwrap();
        assert_eq!(back, b"reply");
    }
}
