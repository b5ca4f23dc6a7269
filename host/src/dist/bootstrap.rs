//! Sharing a few bytes (the NCCL unique id) from rank 0 with every other rank over TCP.
//!
//! Rank 0 listens on an address every rank knows; the others connect, retrying until rank 0 is
//! up, and say who they are; once all have joined, rank 0 sends each the payload. The same code
//! works between processes of one host and between hosts: only the address changes.
//!
//! The wire format, both directions starting with [`MAGIC`]: a peer sends its rank and the world
//! size it was started with (two u32, little-endian); rank 0 answers with a status byte (0: the
//! payload follows; 1: refused, a UTF-8 reason follows) and a u32 length. A connection that does
//! not open with the magic (a port scanner, a stray client) is dropped and does not count; a peer
//! with a different world size, or a rank that is out of range or taken, fails the whole exchange
//! on every rank, with the reason, instead of leaving it to time out.
//!
//! The timeout is one deadline for the whole exchange, on every rank: each connect, read, write
//! and accept gets only what is left of it, so bytes that trickle in do not extend it. Rank 0
//! reads the hellos of up to [`MAX_PENDING`] connections at once, without blocking, and drops the
//! oldest when more arrive, so silent or slow connections neither make it wait on them in turn
//! nor hold it past the deadline; it returns by the deadline, plus at most a quarter of a second
//! spent telling the peers that joined why it gave up. A peer whose connection rank 0 drops
//! before answering connects again, until its own deadline.
use crate::{Error, Result};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The first bytes of every message, so a stranger on the port is recognised and ignored.
pub const MAGIC: [u8; 8] = *b"OPSMITH1";

/// The environment variable the examples read rank 0's address from (`host:port`).
pub const ADDR_ENV: &str = "OPSMITH_DIST_ADDR";

/// The largest payload accepted, so a bad peer cannot make a rank allocate without bound.
const MAX_PAYLOAD: usize = 1 << 20;
/// How many connections rank 0 reads hellos from at once. When another arrives, the oldest is
/// dropped: a stranger can hold a slot only until newer connections push it out, while a real
/// peer's hello comes within a round trip, and a peer whose connection was dropped connects again.
pub const MAX_PENDING: usize = 64;
/// How long rank 0 waits for one connection's hello before dropping it as a stranger.
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// How often rank 0 polls when idle, and how soon the others retry connecting.
const POLL: Duration = Duration::from_millis(20);
/// How often rank 0 polls while hellos are on their way.
const BUSY_POLL: Duration = Duration::from_millis(2);
/// How long rank 0 spends telling peers that the exchange failed: the most it runs past the
/// deadline.
const REFUSE_WAIT: Duration = Duration::from_millis(250);
/// The hello: the magic, the rank and the world size.
const HELLO_LEN: usize = 16;

const STATUS_OK: u8 = 0;
const STATUS_REFUSED: u8 = 1;

/// Sends the payload made by `root_payload` (called on rank 0 only) from rank 0 to every rank
/// of `world_size`, and returns it on every rank.
///
/// Rank 0 listens on `addr` (an address of its host that the other ranks can reach: across hosts
/// not `127.0.0.1`); the others connect to it, retrying until `timeout` has passed. With
/// `world_size` 1 nothing is sent and nothing listens. Every rank fails with
/// [`Error::BootstrapTimeout`] when the exchange does not complete in `timeout`, and with
/// [`Error::Bootstrap`] when a peer was started with another world size, two peers claim one
/// rank, or the address cannot be used.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::dist::broadcast_bytes;
/// use std::time::Duration;
/// let addr = "127.0.0.1:29517".parse().unwrap();
/// let got = broadcast_bytes(0, 1, addr, Duration::from_secs(5), || Ok(b"hello".to_vec()))?;
/// assert_eq!(got, b"hello");
/// # Ok(()) }
/// ```
pub fn broadcast_bytes(
    rank: usize,
    world_size: usize,
    addr: SocketAddr,
    timeout: Duration,
    root_payload: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    check_rank("broadcast_bytes", rank, world_size)?;
    if rank != 0 {
        return fetch_bytes(addr, rank, world_size, timeout);
    }
    let payload = root_payload()?;
    if world_size > 1 {
        let listener = TcpListener::bind(addr).map_err(|e| Error::Bootstrap {
            rank: 0,
            addr,
            reason: format!("cannot listen on {addr}: {e}"),
        })?;
        serve_bytes(listener, world_size, &payload, timeout)?;
    }
    Ok(payload)
}

/// Rank 0's half of [`broadcast_bytes`] on a listener you bound yourself (for instance on port 0,
/// to publish the port the system chose): waits until ranks `1..world_size` have all connected,
/// then sends each `payload`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::dist::{fetch_bytes, serve_bytes};
/// use std::{net::TcpListener, thread, time::Duration};
/// let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// let addr = listener.local_addr().unwrap();
/// let peer = thread::spawn(move || fetch_bytes(addr, 1, 2, Duration::from_secs(10)));
/// serve_bytes(listener, 2, b"id", Duration::from_secs(10))?;
/// assert_eq!(peer.join().unwrap()?, b"id");
/// # Ok(()) }
/// ```
pub fn serve_bytes(listener: TcpListener, world_size: usize, payload: &[u8], timeout: Duration) -> Result<()> {
    let addr = listener.local_addr().map_err(|e| Error::Bootstrap {
        rank: 0,
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        reason: format!("the listener has no address: {e}"),
    })?;
    let fail = |reason: String| Error::Bootstrap { rank: 0, addr, reason };
    check_rank("serve_bytes", 0, world_size)?;
    if payload.len() > MAX_PAYLOAD {
        return Err(fail(format!("a payload of {} bytes exceeds the {MAX_PAYLOAD} a peer accepts", payload.len())));
    }
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true).map_err(|e| fail(format!("cannot poll the listener: {e}")))?;
    let mut peers: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
    let mut joined = 1;
    // Hellos are read from every connection at once, without blocking, so neither a silent nor a
    // slow connection delays the others, and the deadline is checked on every round.
    let mut pending: VecDeque<Pending> = VecDeque::with_capacity(MAX_PENDING);
    while joined < world_size {
        let now = Instant::now();
        if now >= deadline {
            let missing = (1..world_size).filter(|&r| peers[r].is_none()).collect();
            refuse_all(&mut peers, "rank 0 timed out waiting for the other ranks");
            return Err(Error::BootstrapTimeout { rank: 0, addr, timeout, missing });
        }
        let mut progress = false;
        // At most MAX_PENDING a round, so a flood cannot keep this loop from the deadline.
        for _ in 0..MAX_PENDING {
            match listener.accept() {
                Ok((stream, _)) => {
                    progress = true;
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if pending.len() == MAX_PENDING {
                        pending.pop_front();
                    }
                    pending.push_back(Pending { stream, since: now, hello: Vec::with_capacity(HELLO_LEN) });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // A client that gave up before it was accepted.
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::ConnectionAborted) => {}
                Err(e) => {
                    refuse_all(&mut peers, "rank 0 could not accept connections");
                    return Err(fail(format!("accepting a connection failed: {e}")));
                }
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let hello = match pending[i].poll() {
                Poll::Waiting if now.duration_since(pending[i].since) < HELLO_WAIT => {
                    i += 1;
                    continue;
                }
                Poll::Waiting | Poll::Stranger => None,
                Poll::Hello(rank, world) => Some((rank, world)),
            };
            progress = true;
            let Some(Pending { mut stream, .. }) = pending.remove(i) else { break };
            let Some((rank, their_world)) = hello else {
                continue; // not one of ours: dropped without a word
            };
            let problem = if their_world != world_size {
                Some(format!("rank {rank} was started with world size {their_world}, rank 0 with {world_size}"))
            } else if rank == 0 || rank >= world_size {
                Some(format!("a peer claims rank {rank}, outside 1..{world_size}"))
            } else if peers[rank].is_some() {
                Some(format!("two peers claim rank {rank}"))
            } else {
                None
            };
            if let Some(reason) = problem {
                let _ = send(&mut stream, STATUS_REFUSED, reason.as_bytes(), Instant::now() + REFUSE_WAIT);
                refuse_all(&mut peers, &reason);
                return Err(fail(reason));
            }
            peers[rank] = Some(stream);
            joined += 1;
        }
        if !progress {
            let nap = if pending.is_empty() { POLL } else { BUSY_POLL };
            std::thread::sleep(nap.min(deadline.saturating_duration_since(Instant::now())));
        }
    }
    for (rank, stream) in peers.iter_mut().enumerate() {
        if let Some(stream) = stream {
            send(stream, STATUS_OK, payload, deadline)
                .map_err(|e| fail(format!("sending the payload to rank {rank} failed: {e}")))?;
        }
    }
    Ok(())
}

/// The other ranks' half of [`broadcast_bytes`]: connects to rank 0 at `addr` (retrying until it
/// listens or `timeout` has passed), says it is `rank` of `world_size`, and returns rank 0's
/// payload once every rank has joined.
///
/// ```no_run
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::dist::fetch_bytes;
/// let payload = fetch_bytes("10.0.0.1:29500".parse().unwrap(), 3, 8, std::time::Duration::from_secs(60))?;
/// # Ok(()) }
/// ```
pub fn fetch_bytes(addr: SocketAddr, rank: usize, world_size: usize, timeout: Duration) -> Result<Vec<u8>> {
    check_rank("fetch_bytes", rank, world_size)?;
    if rank == 0 {
        return Err(Error::InvalidArgument { op: "fetch_bytes", reason: "rank 0 serves the payload".into() });
    }
    let fail = |reason: String| Error::Bootstrap { rank, addr, reason };
    let timed_out = || Error::BootstrapTimeout { rank, addr, timeout, missing: vec![0] };
    // Every step is bounded by what is left of this one deadline, however the bytes trickle in.
    let deadline = Instant::now() + timeout;
    let mut hello = [0u8; HELLO_LEN];
    hello[..8].copy_from_slice(&MAGIC);
    hello[8..12].copy_from_slice(&(rank as u32).to_le_bytes());
    hello[12..].copy_from_slice(&(world_size as u32).to_le_bytes());
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(timed_out());
        }
        let mut stream = match TcpStream::connect_timeout(&addr, remaining) {
            Ok(stream) => stream,
            // Refused or unreachable: rank 0 may not be listening yet.
            Err(_) => {
                std::thread::sleep(POLL.min(remaining));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let answer = match write_all_by(&mut stream, &hello, deadline) {
            Ok(()) => read_message(&mut stream, deadline),
            Err(e) if is_timeout(&e) => Err(Cut::TimedOut),
            Err(e) => Err(Cut::Closed { got: 0, err: Some(e) }),
        };
        let (status, body) = match answer {
            Ok(message) => message,
            Err(Cut::TimedOut) => return Err(timed_out()),
            // Rank 0 dropped the connection without a word (it had too many at once, or it was
            // not listening yet): connect again.
            Err(Cut::Closed { got: 0, .. }) => {
                std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
                continue;
            }
            Err(Cut::Closed { err, .. }) => {
                let why = err.map_or_else(|| "end of stream".to_string(), |e| e.to_string());
                return Err(fail(format!("rank 0 closed the connection in the middle of its answer: {why}")));
            }
            Err(Cut::Invalid(reason)) => return Err(fail(reason)),
        };
        return match status {
            STATUS_OK => Ok(body),
            STATUS_REFUSED => Err(fail(format!("rank 0 refused: {}", String::from_utf8_lossy(&body)))),
            other => Err(fail(format!("rank 0 answered with unknown status {other}"))),
        };
    }
}

/// Rank 0's address from the environment variable `var` (`host:port`; a host name is resolved,
/// its first address taken), or from `default` when the variable is unset.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::dist::{ADDR_ENV, addr_from_env};
/// let addr = addr_from_env(ADDR_ENV, "127.0.0.1:29500")?; // 127.0.0.1:29500 unless set
/// # let _ = addr;
/// # Ok(()) }
/// ```
pub fn addr_from_env(var: &str, default: &str) -> Result<SocketAddr> {
    let text = std::env::var(var).unwrap_or_else(|_| default.to_string());
    let invalid = |reason: String| Error::InvalidArgument { op: "addr_from_env", reason };
    text.to_socket_addrs()
        .map_err(|e| invalid(format!("{var}={text:?} is not a host:port address: {e}")))?
        .next()
        .ok_or_else(|| invalid(format!("{var}={text:?} resolves to no address")))
}

pub(crate) fn check_rank(op: &'static str, rank: usize, world_size: usize) -> Result<()> {
    if world_size == 0 || world_size > i32::MAX as usize || rank >= world_size {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "rank {rank} of world size {world_size}: need 1 <= world size <= 2^31 - 1 and rank < world size"
            ),
        });
    }
    Ok(())
}

/// A connection rank 0 has accepted and not yet heard a hello from.
struct Pending {
    stream: TcpStream,
    since: Instant,
    hello: Vec<u8>,
}

enum Poll {
    Waiting,
    /// Not an opsmith peer, or gone: dropped.
    Stranger,
    /// A peer's rank and world size.
    Hello(usize, usize),
}

impl Pending {
    /// Reads what has arrived, without blocking.
    fn poll(&mut self) -> Poll {
        let mut chunk = [0u8; HELLO_LEN];
        while self.hello.len() < HELLO_LEN {
            let want = HELLO_LEN - self.hello.len();
            match self.stream.read(&mut chunk[..want]) {
                Ok(0) => return Poll::Stranger,
                Ok(n) => self.hello.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Poll::Stranger,
            }
        }
        let h = &self.hello;
        // A stranger is known by its first bytes, without waiting for the rest.
        if h[..h.len().min(MAGIC.len())] != MAGIC[..h.len().min(MAGIC.len())] {
            return Poll::Stranger;
        }
        if h.len() < HELLO_LEN {
            return Poll::Waiting;
        }
        let rank = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
        let world = u32::from_le_bytes([h[12], h[13], h[14], h[15]]) as usize;
        Poll::Hello(rank, world)
    }
}

/// Why a read did not complete.
enum Cut {
    TimedOut,
    /// The connection ended after `got` bytes.
    Closed {
        got: usize,
        err: Option<std::io::Error>,
    },
    /// The bytes are not an answer of rank 0.
    Invalid(String),
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// The time left until `deadline`, as a socket timeout, or a timeout error when none is left.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::Error::new(ErrorKind::TimedOut, "the deadline passed"));
    }
    Ok(left)
}

/// `write_all` that ends at `deadline`: a socket timeout alone bounds each write, not the sum.
fn write_all_by(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    while !bytes.is_empty() {
        stream.set_write_timeout(Some(left(deadline)?))?;
        match stream.write(bytes) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `read_exact` that ends at `deadline`, however slowly the bytes come.
fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::result::Result<(), Cut> {
    let mut got = 0;
    while got < buf.len() {
        let left = left(deadline).map_err(|_| Cut::TimedOut)?;
        stream.set_read_timeout(Some(left)).map_err(|e| Cut::Closed { got, err: Some(e) })?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => return Err(Cut::Closed { got, err: None }),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(Cut::TimedOut),
            Err(e) => return Err(Cut::Closed { got, err: Some(e) }),
        }
    }
    Ok(())
}

/// One message of rank 0: its status and body.
fn read_message(stream: &mut TcpStream, deadline: Instant) -> std::result::Result<(u8, Vec<u8>), Cut> {
    stream.set_nonblocking(false).map_err(|e| Cut::Closed { got: 0, err: Some(e) })?;
    let mut header = [0u8; 13];
    read_exact_by(stream, &mut header, deadline)?;
    if header[..8] != MAGIC {
        let addr = stream.peer_addr().map_or_else(|_| "rank 0's address".to_string(), |a| a.to_string());
        return Err(Cut::Invalid(format!("the server at {addr} is not an opsmith bootstrap")));
    }
    let len = u32::from_le_bytes([header[9], header[10], header[11], header[12]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(Cut::Invalid(format!("rank 0 announced {len} bytes, more than the {MAX_PAYLOAD} accepted")));
    }
    let mut body = vec![0u8; len];
    read_exact_by(stream, &mut body, deadline).map_err(|cut| match cut {
        // The header came: a cut now is not a dropped connection to retry.
        Cut::Closed { got, err } => Cut::Closed { got: got + header.len(), err },
        other => other,
    })?;
    Ok((header[8], body))
}

fn send(stream: &mut TcpStream, status: u8, body: &[u8], deadline: Instant) -> std::io::Result<()> {
    let mut message = Vec::with_capacity(13 + body.len());
    message.extend_from_slice(&MAGIC);
    message.push(status);
    message.extend_from_slice(&(body.len() as u32).to_le_bytes());
    message.extend_from_slice(body);
    write_all_by(stream, &message, deadline)?;
    stream.flush()
}

/// Tells every peer that has joined that the exchange failed, so it reports why at once.
fn refuse_all(peers: &mut [Option<TcpStream>], reason: &str) {
    let soon = Instant::now() + REFUSE_WAIT;
    for stream in peers.iter_mut().flatten() {
        // Best effort: a peer that has gone away learns nothing, and was not waiting anyway.
        let _ = send(stream, STATUS_REFUSED, reason.as_bytes(), soon);
    }
}
