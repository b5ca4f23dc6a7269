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
use crate::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The first bytes of every message, so a stranger on the port is recognised and ignored.
pub const MAGIC: [u8; 8] = *b"OPSMITH1";

/// The environment variable the examples read rank 0's address from (`host:port`).
pub const ADDR_ENV: &str = "OPSMITH_DIST_ADDR";

/// The largest payload accepted, so a bad peer cannot make a rank allocate without bound.
const MAX_PAYLOAD: usize = 1 << 20;
/// How long rank 0 waits for one connection's hello before dropping it as a stranger.
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// How often rank 0 polls for connections and the others retry connecting.
const POLL: Duration = Duration::from_millis(20);

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
    while joined < world_size {
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = (1..world_size).filter(|&r| peers[r].is_none()).collect();
                    refuse_all(&mut peers, "rank 0 timed out waiting for the other ranks");
                    return Err(Error::BootstrapTimeout { rank: 0, addr, timeout, missing });
                }
                std::thread::sleep(POLL);
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                refuse_all(&mut peers, "rank 0 could not accept connections");
                return Err(fail(format!("accepting a connection failed: {e}")));
            }
        };
        let Some((rank, their_world)) = read_hello(&mut stream, deadline) else {
            continue; // not one of ours
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
            let _ = send(&mut stream, STATUS_REFUSED, reason.as_bytes(), deadline);
            refuse_all(&mut peers, &reason);
            return Err(fail(reason));
        }
        peers[rank] = Some(stream);
        joined += 1;
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
    let deadline = Instant::now() + timeout;
    let mut stream = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(timed_out());
        }
        match TcpStream::connect_timeout(&addr, remaining) {
            Ok(stream) => break stream,
            // Refused or unreachable: rank 0 may not be listening yet.
            Err(_) => std::thread::sleep(POLL.min(remaining)),
        }
    };
    let _ = stream.set_nodelay(true);
    let mut hello = [0u8; 16];
    hello[..8].copy_from_slice(&MAGIC);
    hello[8..12].copy_from_slice(&(rank as u32).to_le_bytes());
    hello[12..].copy_from_slice(&(world_size as u32).to_le_bytes());
    set_timeouts(&stream, deadline).map_err(|e| fail(format!("configuring the connection failed: {e}")))?;
    stream.write_all(&hello).map_err(|e| fail(format!("sending the hello failed: {e}")))?;
    let is_timeout = |e: &std::io::Error| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
    let mut header = [0u8; 13];
    stream.read_exact(&mut header).map_err(|e| {
        if is_timeout(&e) { timed_out() } else { fail(format!("rank 0 closed the connection before answering: {e}")) }
    })?;
    if header[..8] != MAGIC {
        return Err(fail(format!("the server at {addr} is not an opsmith bootstrap")));
    }
    let len = u32::from_le_bytes([header[9], header[10], header[11], header[12]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(fail(format!("rank 0 announced {len} bytes, more than the {MAX_PAYLOAD} accepted")));
    }
    let mut body = vec![0u8; len];
    stream
        .read_exact(&mut body)
        .map_err(|e| if is_timeout(&e) { timed_out() } else { fail(format!("the payload was cut short: {e}")) })?;
    match header[8] {
        STATUS_OK => Ok(body),
        STATUS_REFUSED => Err(fail(format!("rank 0 refused: {}", String::from_utf8_lossy(&body)))),
        other => Err(fail(format!("rank 0 answered with unknown status {other}"))),
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

/// Read and write timeouts that end at `deadline` (at least a millisecond: zero means "none").
fn set_timeouts(stream: &TcpStream, deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}

/// A peer's (rank, world size), or `None` for a connection that is not an opsmith peer.
fn read_hello(stream: &mut TcpStream, deadline: Instant) -> Option<(usize, usize)> {
    stream.set_nonblocking(false).ok()?;
    let wait = deadline.saturating_duration_since(Instant::now()).min(HELLO_WAIT).max(Duration::from_millis(1));
    stream.set_read_timeout(Some(wait)).ok()?;
    let mut hello = [0u8; 16];
    stream.read_exact(&mut hello).ok()?;
    if hello[..8] != MAGIC {
        return None;
    }
    let rank = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]) as usize;
    let world = u32::from_le_bytes([hello[12], hello[13], hello[14], hello[15]]) as usize;
    Some((rank, world))
}

fn send(stream: &mut TcpStream, status: u8, body: &[u8], deadline: Instant) -> std::io::Result<()> {
    set_timeouts(stream, deadline)?;
    let mut message = Vec::with_capacity(13 + body.len());
    message.extend_from_slice(&MAGIC);
    message.push(status);
    message.extend_from_slice(&(body.len() as u32).to_le_bytes());
    message.extend_from_slice(body);
    stream.write_all(&message)?;
    stream.flush()
}

/// Tells every peer that has joined that the exchange failed, so it reports why at once.
fn refuse_all(peers: &mut [Option<TcpStream>], reason: &str) {
    let soon = Instant::now() + Duration::from_secs(1);
    for stream in peers.iter_mut().flatten() {
        // Best effort: a peer that has gone away learns nothing, and was not waiting anyway.
        let _ = send(stream, STATUS_REFUSED, reason.as_bytes(), soon);
    }
}
