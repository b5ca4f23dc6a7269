//! Sharing a few bytes (the NCCL unique id) from rank 0 with every other rank over TCP.
//!
//! Rank 0 listens on an address every rank knows; the others connect, retrying until rank 0 is
//! up, and say who they are; once all have joined, rank 0 sends each the payload. The same code
//! works between processes of one host and between hosts: only the address changes.
//!
//! # Deadline and limits
//!
//! The timeout is one deadline for the whole exchange, on every rank: each connect, read, write
//! and accept gets only what is left of it, so bytes that trickle in do not extend it. Rank 0
//! reads the hellos of up to [`MAX_PENDING`] connections at once, without blocking, and drops the
//! oldest when more arrive, so silent or slow connections neither make it wait on them in turn
//! nor hold it past the deadline; it returns by the deadline, plus at most a quarter of a second
//! spent telling the peers that joined why it gave up. A peer whose connection rank 0 drops
//! before answering connects again, until its own deadline.
//!
//! # Trust model
//!
//! Anyone who can open a TCP connection to rank 0's port can take part in the exchange, as far
//! as rank 0 lets them:
//!
//! * Without a token the exchange is unauthenticated, like NCCL's own traffic: whoever reaches
//!   the port can claim a free rank and receive the payload (with NCCL, the unique id, enough to
//!   join the communicator), or fail the job with a hello that claims another world size or a
//!   taken rank.
//! * With a [`Token`] shared by every rank ([`TOKEN_ENV`] for `bootstrap_tcp`), rank 0 acts on a hello only once the connection
//!   has proven that it holds the token, and sends nothing but a challenge and a refusal before
//!   then. A connection that does not prove it is dropped and does not count: it can neither
//!   learn the payload nor fail the job. Rank 0 proves it holds the token too, so a peer takes no
//!   payload from an impostor. The token never crosses the network.
//! * Either way, the payload crosses the network in the clear: whoever can read the traffic
//!   between the hosts learns it; the token authenticates, it does not encrypt. And strangers
//!   can still flood the port and keep real peers from joining until the deadline (rank 0
//!   returns by then regardless). So keep the port, like NCCL's, on a private network between
//!   the job's hosts, and make the token long and random (`openssl rand -hex 32`): whoever
//!   records one exchange can try to guess a short token offline.
//!
//! # Wire format
//!
//! Every message starts with [`MAGIC`]; integers are u32, little-endian.
//!
//! * The hello, from a peer (49 bytes): its rank, the world size it was started with, a flags
//!   byte (1: it has a token; any other bit set: not a peer) and a 32-byte random nonce (zeros
//!   without a token).
//! * Rank 0's messages: a status byte (0: the payload follows; 1: refused, a UTF-8 reason
//!   follows; 2: a challenge, a 32-byte nonce follows), the length and the body; then, after a
//!   challenge was answered, a 32-byte tag.
//! * With a token on both sides, rank 0 answers the hello with a challenge, and the peer with
//!   `HMAC-SHA-256(token, "opsmith-dist/2 peer proof" ‖ hello ‖ challenge nonce)`, which rank 0
//!   checks in constant time before it reads the hello's rank. Rank 0's later messages to it
//!   carry `HMAC-SHA-256(token, "opsmith-dist/2 rank 0 answer" ‖ hello ‖ challenge nonce ‖
//!   message)`, which the peer checks before it believes them. Both nonces are fresh, so a proof
//!   or a tag is good for one connection only and cannot be replayed.
//! * A token on one side only is a misconfiguration: rank 0 refuses the peer, with the reason,
//!   and goes on without it.
//!
//! A connection that does not open with the magic (a port scanner, a stray client) is dropped
//! without a word and does not count. A peer (an authenticated one, with a token) that was
//! started with a different world size, or claims a rank that is out of range or taken, fails the
//! whole exchange on every rank, with the reason, instead of leaving it to time out.
use crate::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The first bytes of every message, so a stranger on the port is recognised and ignored.
pub const MAGIC: [u8; 8] = *b"OPSMITH2";

/// The environment variable the examples read rank 0's address from (`host:port`).
pub const ADDR_ENV: &str = "OPSMITH_DIST_ADDR";

/// The environment variable `bootstrap_tcp` reads the shared [`Token`] from (see
/// [`Token::from_env`]); unset, the exchange is unauthenticated.
pub const TOKEN_ENV: &str = "OPSMITH_DIST_TOKEN";

/// How many connections rank 0 reads hellos from at once. When another arrives, the oldest is
/// dropped: a stranger can hold a slot only until newer connections push it out, while a real
/// peer's hello comes within a round trip, and a peer whose connection was dropped connects again.
pub const MAX_PENDING: usize = 64;

/// The largest payload accepted, so a bad peer cannot make a rank allocate without bound.
const MAX_PAYLOAD: usize = 1 << 20;
/// How long rank 0 waits for one connection's hello (and proof) before dropping it.
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// How often rank 0 polls when idle, and how soon the others retry connecting.
const POLL: Duration = Duration::from_millis(20);
/// How often rank 0 polls while hellos are on their way.
const BUSY_POLL: Duration = Duration::from_millis(2);
/// How long rank 0 spends telling peers that the exchange failed: the most it runs past the
/// deadline.
const REFUSE_WAIT: Duration = Duration::from_millis(250);

const NONCE_LEN: usize = 32;
const TAG_LEN: usize = 32;
/// The hello: the magic, the rank, the world size, the flags and the peer's nonce.
const HELLO_LEN: usize = 8 + 4 + 4 + 1 + NONCE_LEN;
/// What both proofs are computed over: the hello and rank 0's challenge.
const TRANSCRIPT_LEN: usize = HELLO_LEN + NONCE_LEN;
/// The header of rank 0's messages: the magic, the status and the body's length.
const HEADER_LEN: usize = 8 + 1 + 4;
const FLAG_TOKEN: u8 = 1;

const STATUS_OK: u8 = 0;
const STATUS_REFUSED: u8 = 1;
const STATUS_CHALLENGE: u8 = 2;

/// Domain separation: a peer's proof can never pass for rank 0's tag, or the other way round.
const PROOF_LABEL: &[u8] = b"opsmith-dist/2 peer proof";
const ANSWER_LABEL: &[u8] = b"opsmith-dist/2 rank 0 answer";

/// A secret shared by every rank of a job: rank 0 and each peer prove to each other that they
/// hold it before rank 0 acts on the peer's hello or the peer believes rank 0's answer, with
/// HMAC-SHA-256 over fresh nonces (see the [`dist`](super) module for the trust model). It never
/// crosses the network, and its `Debug` does not show it.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::dist::{Token, TOKEN_ENV};
/// let token = Token::new("4b1d0c5e9a7f2e13b6d8a0c4f9e2d7b1")?;
/// let from_env = Token::from_env(TOKEN_ENV)?; // None unless OPSMITH_DIST_TOKEN is set
/// # let _ = (token, from_env);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Token {
    /// HMAC-SHA-256 keyed with the secret, cloned for every message.
    key: Hmac<Sha256>,
}

impl Token {
    /// A token made of `secret`'s bytes; use a long random one (`openssl rand -hex 32`).
    /// An empty secret is an [`Error::InvalidArgument`].
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Token> {
        let secret = secret.as_ref();
        let invalid = |reason: &str| Error::InvalidArgument { op: "Token::new", reason: reason.into() };
        if secret.is_empty() {
            return Err(invalid("an empty token authenticates nothing"));
        }
        let key = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| invalid("HMAC-SHA-256 refused the key"))?;
        Ok(Token { key })
    }

    /// The token in the environment variable `var` (usually [`TOKEN_ENV`]), or `None` when it is
    /// unset. Set but empty, or not UTF-8, it is an [`Error::InvalidArgument`] rather than a
    /// silent fall back to no authentication.
    pub fn from_env(var: &str) -> Result<Option<Token>> {
        let invalid = |reason: String| Error::InvalidArgument { op: "Token::from_env", reason };
        match std::env::var(var) {
            Ok(text) if text.is_empty() => {
                Err(invalid(format!("{var} is set but empty: unset it to run unauthenticated, or set it to a secret")))
            }
            Ok(text) => Token::new(text).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(invalid(format!("{var} is not valid UTF-8"))),
        }
    }

    fn mac(&self, label: &[u8], transcript: &[u8; TRANSCRIPT_LEN], message: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.key.clone();
        mac.update(label);
        mac.update(transcript);
        mac.update(message);
        mac
    }

    fn proof(&self, transcript: &[u8; TRANSCRIPT_LEN]) -> [u8; TAG_LEN] {
        self.mac(PROOF_LABEL, transcript, &[]).finalize().into_bytes().into()
    }

    /// Constant-time, so the answer's timing tells a guesser nothing.
    fn proof_holds(&self, transcript: &[u8; TRANSCRIPT_LEN], proof: &[u8]) -> bool {
        self.mac(PROOF_LABEL, transcript, &[]).verify_slice(proof).is_ok()
    }

    fn tag(&self, transcript: &[u8; TRANSCRIPT_LEN], message: &[u8]) -> [u8; TAG_LEN] {
        self.mac(ANSWER_LABEL, transcript, message).finalize().into_bytes().into()
    }

    fn tag_holds(&self, transcript: &[u8; TRANSCRIPT_LEN], message: &[u8], tag: &[u8]) -> bool {
        self.mac(ANSWER_LABEL, transcript, message).verify_slice(tag).is_ok()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Fresh nonces: SHA-256 of a secret random seed and a counter, so the system's randomness is
/// asked (and can fail) once per exchange, before any connection.
struct Nonces {
    seed: [u8; 32],
    count: u64,
}

impl Nonces {
    fn new() -> std::result::Result<Nonces, String> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| format!("the system has no randomness for the token's nonces: {e}"))?;
        Ok(Nonces { seed, count: 0 })
    }

    fn next(&mut self) -> [u8; NONCE_LEN] {
        self.count += 1;
        Sha256::new().chain_update(self.seed).chain_update(self.count.to_le_bytes()).finalize().into()
    }
}

/// Sends the payload made by `root_payload` (called on rank 0 only) from rank 0 to every rank
/// of `world_size`, and returns it on every rank.
///
/// Rank 0 listens on `addr` (an address of its host that the other ranks can reach: across hosts
/// not `127.0.0.1`); the others connect to it, retrying until `timeout` has passed. With a
/// `token`, every rank must have the same one (see [`Token`]); without, the exchange is
/// unauthenticated. With `world_size` 1 nothing is sent and nothing listens. Every rank fails
/// with [`Error::BootstrapTimeout`] when the exchange does not complete in `timeout`, and with
/// [`Error::Bootstrap`] when a peer was started with another world size, two peers claim one
/// rank, the tokens differ, or the address cannot be used.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::dist::broadcast_bytes;
/// use std::time::Duration;
/// let addr = "127.0.0.1:29517".parse().unwrap();
/// let got = broadcast_bytes(0, 1, addr, Duration::from_secs(5), None, || Ok(b"hello".to_vec()))?;
/// assert_eq!(got, b"hello");
/// # Ok(()) }
/// ```
pub fn broadcast_bytes(
    rank: usize,
    world_size: usize,
    addr: SocketAddr,
    timeout: Duration,
    token: Option<&Token>,
    root_payload: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    check_rank("broadcast_bytes", rank, world_size)?;
    if rank != 0 {
        return fetch_bytes(addr, rank, world_size, timeout, token);
    }
    let payload = root_payload()?;
    if world_size > 1 {
        let listener = TcpListener::bind(addr).map_err(|e| Error::Bootstrap {
            rank: 0,
            addr,
            reason: format!("cannot listen on {addr}: {e}"),
        })?;
        serve_bytes(listener, world_size, &payload, timeout, token)?;
    }
    Ok(payload)
}

/// Rank 0's half of [`broadcast_bytes`] on a listener you bound yourself (for instance on port 0,
/// to publish the port the system chose): waits until ranks `1..world_size` have all connected
/// (and, with a `token`, proven that they hold it), then sends each `payload`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::dist::{Token, fetch_bytes, serve_bytes};
/// use std::{net::TcpListener, thread, time::Duration};
/// let token = Token::new("a long random secret that every rank knows")?;
/// let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// let addr = listener.local_addr().unwrap();
/// let peer = thread::spawn({
///     let token = token.clone();
///     move || fetch_bytes(addr, 1, 2, Duration::from_secs(10), Some(&token))
/// });
/// serve_bytes(listener, 2, b"id", Duration::from_secs(10), Some(&token))?;
/// assert_eq!(peer.join().unwrap()?, b"id");
/// # Ok(()) }
/// ```
pub fn serve_bytes(
    listener: TcpListener,
    world_size: usize,
    payload: &[u8],
    timeout: Duration,
    token: Option<&Token>,
) -> Result<()> {
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
    let mut nonces = match token {
        Some(_) => Some(Nonces::new().map_err(fail)?),
        None => None,
    };
    listener.set_nonblocking(true).map_err(|e| fail(format!("cannot poll the listener: {e}")))?;
    let mut peers: Vec<Option<Joined>> = (0..world_size).map(|_| None).collect();
    let mut joined = 1;
    // Hellos are read from every connection at once, without blocking, so neither a silent nor a
    // slow connection delays the others, and the deadline is checked on every round.
    let mut pending: VecDeque<Pending> = VecDeque::with_capacity(MAX_PENDING);
    while joined < world_size {
        let now = Instant::now();
        if now >= deadline {
            let missing = (1..world_size).filter(|&r| peers[r].is_none()).collect();
            refuse_all(&mut peers, "rank 0 timed out waiting for the other ranks", token, now + REFUSE_WAIT);
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
                    pending.push_back(Pending { stream, since: now, got: Vec::new(), challenge: None });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // A client that gave up before it was accepted.
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::ConnectionAborted) => {}
                Err(e) => {
                    let until = Instant::now() + REFUSE_WAIT;
                    refuse_all(&mut peers, "rank 0 could not accept connections", token, until);
                    return Err(fail(format!("accepting a connection failed: {e}")));
                }
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let hello = match pending[i].poll(token, &mut nonces) {
                Poll::Waiting if now.duration_since(pending[i].since) < HELLO_WAIT => {
                    i += 1;
                    continue;
                }
                Poll::Waiting | Poll::Stranger => None,
                Poll::Hello { rank, world, auth } => Some((rank, world, auth)),
            };
            progress = true;
            let Some(Pending { stream, .. }) = pending.remove(i) else { break };
            let Some((rank, their_world, auth)) = hello else {
                continue; // not one of ours, or not proven: dropped, and it does not count
            };
            let mut peer = Joined { stream, auth };
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
                let until = Instant::now() + REFUSE_WAIT;
                let _ = peer.send(STATUS_REFUSED, reason.as_bytes(), until, token);
                refuse_all(&mut peers, &reason, token, until);
                return Err(fail(reason));
            }
            peers[rank] = Some(peer);
            joined += 1;
        }
        if !progress {
            let nap = if pending.is_empty() { POLL } else { BUSY_POLL };
            std::thread::sleep(nap.min(deadline.saturating_duration_since(Instant::now())));
        }
    }
    for (rank, peer) in peers.iter_mut().enumerate() {
        if let Some(peer) = peer {
            peer.send(STATUS_OK, payload, deadline, token)
                .map_err(|e| fail(format!("sending the payload to rank {rank} failed: {e}")))?;
        }
    }
    Ok(())
}

/// The other ranks' half of [`broadcast_bytes`]: connects to rank 0 at `addr` (retrying until it
/// listens or `timeout` has passed), says it is `rank` of `world_size` (proving, with a `token`,
/// that it holds rank 0's), and returns rank 0's payload once every rank has joined.
///
/// ```no_run
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::dist::{TOKEN_ENV, Token, fetch_bytes};
/// let token = Token::from_env(TOKEN_ENV)?;
/// let addr = "10.0.0.1:29500".parse().unwrap();
/// let payload = fetch_bytes(addr, 3, 8, std::time::Duration::from_secs(60), token.as_ref())?;
/// # Ok(()) }
/// ```
pub fn fetch_bytes(
    addr: SocketAddr,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    token: Option<&Token>,
) -> Result<Vec<u8>> {
    check_rank("fetch_bytes", rank, world_size)?;
    if rank == 0 {
        return Err(Error::InvalidArgument { op: "fetch_bytes", reason: "rank 0 serves the payload".into() });
    }
    let fail = |reason: String| Error::Bootstrap { rank, addr, reason };
    let timed_out = || Error::BootstrapTimeout { rank, addr, timeout, missing: vec![0] };
    // Every step is bounded by what is left of this one deadline, however the bytes trickle in.
    let deadline = Instant::now() + timeout;
    let mut nonces = match token {
        Some(_) => Some(Nonces::new().map_err(fail)?),
        None => None,
    };
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
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(&MAGIC);
        hello[8..12].copy_from_slice(&(rank as u32).to_le_bytes());
        hello[12..16].copy_from_slice(&(world_size as u32).to_le_bytes());
        if let Some(nonces) = &mut nonces {
            hello[16] = FLAG_TOKEN;
            hello[17..].copy_from_slice(&nonces.next());
        }
        match exchange(&mut stream, &hello, token, deadline) {
            Ok(payload) => return Ok(payload),
            Err(Cut::TimedOut) => return Err(timed_out()),
            // Rank 0 dropped the connection without a word (it had too many at once, or it was
            // not listening yet): connect again.
            Err(Cut::Closed { got: 0, .. }) => {
                std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
            }
            Err(Cut::Closed { err, .. }) => {
                let why = err.map_or_else(|| "end of stream".to_string(), |e| e.to_string());
                return Err(fail(format!("rank 0 closed the connection in the middle of its answer: {why}")));
            }
            Err(Cut::Invalid(reason)) => return Err(fail(reason)),
        }
    }
}

/// One attempt of a peer on a fresh connection: the hello, the challenge when there is a token,
/// and rank 0's answer.
fn exchange(
    stream: &mut TcpStream,
    hello: &[u8; HELLO_LEN],
    token: Option<&Token>,
    deadline: Instant,
) -> std::result::Result<Vec<u8>, Cut> {
    write_all_by(stream, hello, deadline).map_err(Cut::unsent)?;
    let (mut status, mut body) = read_message(stream, deadline)?;
    match (token, status) {
        (Some(token), STATUS_CHALLENGE) => {
            let challenge: [u8; NONCE_LEN] = body.as_slice().try_into().map_err(|_| {
                Cut::Invalid(format!("rank 0's challenge has {} bytes instead of {NONCE_LEN}", body.len()))
            })?;
            let transcript = transcript(hello, &challenge);
            write_all_by(stream, &token.proof(&transcript), deadline).map_err(Cut::unsent)?;
            (status, body) = read_message(stream, deadline)?;
            let mut tag = [0u8; TAG_LEN];
            read_exact_by(stream, &mut tag, deadline).map_err(|cut| cut.after(HEADER_LEN + body.len()))?;
            if !token.tag_holds(&transcript, &message(status, &body), &tag) {
                return Err(Cut::Invalid(
                    "rank 0's answer does not carry this rank's token: the tokens differ, or the server is not rank 0"
                        .into(),
                ));
            }
        }
        (None, STATUS_CHALLENGE) => {
            return Err(Cut::Invalid(format!(
                "rank 0 asks for a token and this rank has none: set {TOKEN_ENV} to the same secret on every rank"
            )));
        }
        (Some(_), STATUS_OK) => {
            return Err(Cut::Invalid(
                "rank 0 sent the payload without proving that it holds the token (it has none, or it is not rank 0)"
                    .into(),
            ));
        }
        // A refusal before any challenge (the tokens are set on one side only), or the payload
        // without a token on either side.
        _ => {}
    }
    match status {
        STATUS_OK => Ok(body),
        STATUS_REFUSED => Err(Cut::Invalid(format!("rank 0 refused: {}", String::from_utf8_lossy(&body)))),
        other => Err(Cut::Invalid(format!("rank 0 answered with unknown status {other}"))),
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

/// A connection rank 0 has accepted and not yet heard a (proven) hello from.
struct Pending {
    stream: TcpStream,
    since: Instant,
    /// The hello, then the proof, as they arrive.
    got: Vec<u8>,
    /// The nonce rank 0 challenged it with, once sent.
    challenge: Option<[u8; NONCE_LEN]>,
}

enum Poll {
    Waiting,
    /// Not an opsmith peer, not proven, or gone: dropped.
    Stranger,
    /// A peer's rank and world size, and what its proof was over when it gave one.
    Hello {
        rank: usize,
        world: usize,
        auth: Option<[u8; TRANSCRIPT_LEN]>,
    },
}

impl Pending {
    /// Reads what has arrived, without blocking, and answers the hello with a challenge when
    /// rank 0 has a token.
    fn poll(&mut self, token: Option<&Token>, nonces: &mut Option<Nonces>) -> Poll {
        let want = if self.challenge.is_some() { HELLO_LEN + TAG_LEN } else { HELLO_LEN };
        let mut chunk = [0u8; HELLO_LEN + TAG_LEN];
        while self.got.len() < want {
            match self.stream.read(&mut chunk[..want - self.got.len()]) {
                Ok(0) => return Poll::Stranger,
                Ok(n) => self.got.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Poll::Stranger,
            }
        }
        let seen = self.got.len().min(MAGIC.len());
        // A stranger is known by its first bytes, without waiting for the rest.
        if self.got[..seen] != MAGIC[..seen] {
            return Poll::Stranger;
        }
        if self.got.len() < want {
            return Poll::Waiting;
        }
        let mut hello = [0u8; HELLO_LEN];
        hello.copy_from_slice(&self.got[..HELLO_LEN]);
        let rank = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]) as usize;
        let world = u32::from_le_bytes([hello[12], hello[13], hello[14], hello[15]]) as usize;
        let flags = hello[16];
        if flags & !FLAG_TOKEN != 0 {
            return Poll::Stranger; // garbled, or a later protocol
        }
        match (token, nonces.as_mut(), flags & FLAG_TOKEN != 0) {
            (None, _, false) => Poll::Hello { rank, world, auth: None },
            (None, _, true) => {
                self.say(&message(
                    STATUS_REFUSED,
                    format!("rank 0 has no token but rank {rank} has one: set {TOKEN_ENV} on every rank or on none")
                        .as_bytes(),
                ));
                Poll::Stranger
            }
            (Some(_), _, false) => {
                self.say(&message(
                    STATUS_REFUSED,
                    format!("rank 0 requires a token and rank {rank} has none: set {TOKEN_ENV} on every rank")
                        .as_bytes(),
                ));
                Poll::Stranger
            }
            (Some(token), Some(nonces), true) => match self.challenge {
                None => {
                    let challenge = nonces.next();
                    // The first bytes on a fresh connection: they fit its send buffer whole.
                    if !self.say(&message(STATUS_CHALLENGE, &challenge)) {
                        return Poll::Stranger;
                    }
                    self.challenge = Some(challenge);
                    Poll::Waiting
                }
                Some(challenge) => {
                    let transcript = transcript(&hello, &challenge);
                    if token.proof_holds(&transcript, &self.got[HELLO_LEN..]) {
                        return Poll::Hello { rank, world, auth: Some(transcript) };
                    }
                    let refusal = message(STATUS_REFUSED, b"the proof does not match rank 0's token");
                    let tag = token.tag(&transcript, &refusal);
                    self.say(&[refusal.as_slice(), &tag].concat());
                    Poll::Stranger
                }
            },
            (Some(_), None, true) => Poll::Stranger, // rank 0 always has nonces with a token
        }
    }

    /// Writes `bytes` if the socket takes them at once (best effort: this connection is not
    /// worth waiting for); whether it took them all.
    fn say(&mut self, bytes: &[u8]) -> bool {
        matches!(self.stream.write(bytes), Ok(n) if n == bytes.len())
    }
}

/// A peer that has joined, with what its proof was over when it gave one.
struct Joined {
    stream: TcpStream,
    auth: Option<[u8; TRANSCRIPT_LEN]>,
}

impl Joined {
    /// Sends rank 0's message, tagged when the peer proved the token.
    fn send(&mut self, status: u8, body: &[u8], deadline: Instant, token: Option<&Token>) -> std::io::Result<()> {
        let mut bytes = message(status, body);
        if let (Some(token), Some(transcript)) = (token, &self.auth) {
            let tag = token.tag(transcript, &bytes);
            bytes.extend_from_slice(&tag);
        }
        write_all_by(&mut self.stream, &bytes, deadline)?;
        self.stream.flush()
    }
}

/// Rank 0's message without its tag: the magic, the status, the length and the body.
fn message(status: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + body.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.push(status);
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

fn transcript(hello: &[u8; HELLO_LEN], challenge: &[u8; NONCE_LEN]) -> [u8; TRANSCRIPT_LEN] {
    let mut transcript = [0u8; TRANSCRIPT_LEN];
    transcript[..HELLO_LEN].copy_from_slice(hello);
    transcript[HELLO_LEN..].copy_from_slice(challenge);
    transcript
}

/// Why a peer's read or write did not complete.
enum Cut {
    TimedOut,
    /// The connection ended after `got` bytes of rank 0's answer.
    Closed {
        got: usize,
        err: Option<std::io::Error>,
    },
    /// The bytes are not a valid answer of rank 0.
    Invalid(String),
}

impl Cut {
    /// A write of the peer that failed: rank 0 has sent nothing on this connection since.
    fn unsent(e: std::io::Error) -> Cut {
        if is_timeout(&e) { Cut::TimedOut } else { Cut::Closed { got: 0, err: Some(e) } }
    }

    /// The same cut, `before` bytes into the answer.
    fn after(self, before: usize) -> Cut {
        match self {
            Cut::Closed { got, err } => Cut::Closed { got: got + before, err },
            other => other,
        }
    }
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

/// One message of rank 0, without its tag: its status and body.
fn read_message(stream: &mut TcpStream, deadline: Instant) -> std::result::Result<(u8, Vec<u8>), Cut> {
    stream.set_nonblocking(false).map_err(|e| Cut::Closed { got: 0, err: Some(e) })?;
    let mut header = [0u8; HEADER_LEN];
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
    // The header came: a cut now is not a dropped connection to retry.
    read_exact_by(stream, &mut body, deadline).map_err(|cut| cut.after(HEADER_LEN))?;
    Ok((header[8], body))
}

/// Tells every peer that has joined that the exchange failed, so it reports why at once; all of
/// them by `until`.
fn refuse_all(peers: &mut [Option<Joined>], reason: &str, token: Option<&Token>, until: Instant) {
    for peer in peers.iter_mut().flatten() {
        // Best effort: a peer that has gone away learns nothing, and was not waiting anyway.
        let _ = peer.send(STATUS_REFUSED, reason.as_bytes(), until, token);
    }
}
