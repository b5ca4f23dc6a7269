//! The TCP bootstrap of `opsmith_host::dist`, over loopback and without NCCL, and the typed
//! error that replaces cudarc's panic when NCCL is missing.
#[cfg(feature = "nccl")]
use opsmith_host::Device;
use opsmith_host::dist;
use opsmith_host::dist::Token;
#[cfg(feature = "nccl")]
use opsmith_host::dist::{Communicator, UniqueId};
use opsmith_host::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(20);
/// What a deadline may be overrun by on a loaded 2-core CI machine; far below what a
/// per-read timeout let a slow peer stretch it to.
const MARGIN: Duration = Duration::from_millis(1500);

/// A loopback address with a port nothing listens on right now.
fn free_addr() -> SocketAddr {
    let probe = TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap()
}

fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// 128 bytes that are neither constant nor zero, like an NCCL id.
fn payload() -> Vec<u8> {
    (0..128u32).map(|i| (i * 37 + 11) as u8).collect()
}

fn fetch(addr: SocketAddr, rank: usize, world: usize, timeout: Duration) -> thread::JoinHandle<Result<Vec<u8>>> {
    fetch_with(addr, rank, world, timeout, None)
}

fn fetch_with(
    addr: SocketAddr,
    rank: usize,
    world: usize,
    timeout: Duration,
    token: Option<Token>,
) -> thread::JoinHandle<Result<Vec<u8>>> {
    thread::spawn(move || dist::fetch_bytes(addr, rank, world, timeout, token.as_ref()))
}

/// The secret every rank of the tests' jobs shares.
fn token() -> Token {
    Token::new("9c1f4e7a2b8d0c3e5f6a7b8c9d0e1f2a").unwrap()
}

/// The length of a peer's hello, as the wire format lays it out: the magic, rank, world size,
/// flags and a 32-byte nonce.
const HELLO_LEN: usize = 49;

/// A hello that a stranger forges: it knows the wire format, not the token.
fn forged_hello(rank: u32, world: u32, flags: u8) -> Vec<u8> {
    let mut hello = dist::MAGIC.to_vec();
    hello.extend_from_slice(&rank.to_le_bytes());
    hello.extend_from_slice(&world.to_le_bytes());
    hello.push(flags);
    hello.extend_from_slice(&[0x5A; 32]);
    assert_eq!(hello.len(), HELLO_LEN);
    hello
}

/// Reads one message of rank 0 (or of a fake one): its status and body, and its 32-byte tag
/// when `tagged`.
fn read_message(stream: &mut TcpStream, tagged: bool) -> (u8, Vec<u8>) {
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut header = [0u8; 13];
    stream.read_exact(&mut header).unwrap();
    assert_eq!(header[..8], dist::MAGIC);
    let mut body = vec![0u8; u32::from_le_bytes(header[9..13].try_into().unwrap()) as usize];
    stream.read_exact(&mut body).unwrap();
    if tagged {
        stream.read_exact(&mut [0u8; 32]).unwrap();
    }
    (header[8], body)
}

/// A message as rank 0 sends it, without a tag.
fn message(status: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = dist::MAGIC.to_vec();
    bytes.push(status);
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// What is left on the connection until rank 0 closes it (5 s at most).
fn rest(stream: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.read_to_end(&mut rest).unwrap();
    rest
}

#[test]
fn four_ranks_share_the_payload_over_loopback() -> Result<()> {
    let addr = free_addr();
    // The other ranks start first, so they must retry until rank 0 listens.
    let peers: Vec<_> = (1..4)
        .map(|rank| {
            thread::spawn(move || {
                dist::broadcast_bytes(rank, 4, addr, LONG, None, || panic!("only rank 0 makes the payload"))
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let root = dist::broadcast_bytes(0, 4, addr, LONG, None, || Ok(payload()))?;
    assert_eq!(root, payload());
    for peer in peers {
        assert_eq!(peer.join().unwrap()?, payload());
    }
    Ok(())
}

#[test]
fn a_world_of_one_needs_no_network() -> Result<()> {
    // Nothing listens: the address is not even bound.
    let got = dist::broadcast_bytes(0, 1, free_addr(), Duration::from_millis(1), None, || Ok(payload()))?;
    assert_eq!(got, payload());
    Ok(())
}

#[test]
fn a_peer_without_rank_0_times_out() {
    let addr = free_addr();
    let start = Instant::now();
    let err = dist::fetch_bytes(addr, 2, 3, Duration::from_millis(300), None).unwrap_err();
    let waited = start.elapsed();
    assert!(
        matches!(&err, Error::BootstrapTimeout { rank: 2, addr: a, missing, .. } if *a == addr && missing == &[0]),
        "{err}"
    );
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(10), "waited {waited:?}");
}

#[test]
fn rank_0_times_out_naming_the_missing_ranks_and_releases_the_others() {
    for token in [None, Some(token())] {
        let (listener, addr) = listener();
        let joined = fetch_with(addr, 2, 4, LONG, token.clone());
        let err = dist::serve_bytes(listener, 4, &payload(), Duration::from_millis(500), token.as_ref()).unwrap_err();
        assert!(matches!(&err, Error::BootstrapTimeout { rank: 0, missing, .. } if missing == &[1, 3]), "{err}");
        // Rank 2 had joined: it hears at once that rank 0 gave up (through a tagged message, with
        // a token), instead of waiting out its own 20 s.
        let start = Instant::now();
        let err = joined.join().unwrap().unwrap_err();
        assert!(matches!(&err, Error::Bootstrap { rank: 2, reason, .. } if reason.contains("timed out")), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}

#[test]
fn strangers_on_the_port_are_ignored() -> Result<()> {
    let (listener, addr) = listener();
    let root = thread::spawn(move || dist::serve_bytes(listener, 2, &payload(), LONG, None));
    // A client speaking another protocol, and one that connects and says nothing.
    let mut http = TcpStream::connect(addr).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let silent = TcpStream::connect(addr).unwrap();
    drop(silent);
    assert_eq!(fetch(addr, 1, 2, LONG).join().unwrap()?, payload());
    root.join().unwrap()?;
    // The stranger got nothing: rank 0 closed its connection without a word.
    let mut answer = Vec::new();
    http.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = http.read_to_end(&mut answer);
    assert!(answer.is_empty(), "the stranger was sent {answer:?}");
    Ok(())
}

/// Writes `bytes` one at a time, `gap` apart, until they run out, a write fails or `stop` is set.
fn trickle(mut stream: TcpStream, bytes: Vec<u8>, gap: Duration, stop: Arc<AtomicBool>) {
    for byte in bytes {
        if stop.load(Ordering::Relaxed) || stream.write_all(&[byte]).is_err() {
            return;
        }
        thread::sleep(gap);
    }
}

#[test]
fn a_trickling_stranger_cannot_hold_rank_0_past_its_deadline() {
    let (listener, addr) = listener();
    let stop = Arc::new(AtomicBool::new(false));
    let stranger = TcpStream::connect(addr).unwrap();
    // The magic, then zeros: each byte comes before a per-read timeout of 1 s would expire.
    let mut bytes = dist::MAGIC.to_vec();
    bytes.resize(64, 0);
    let slow = thread::spawn({
        let stop = stop.clone();
        move || trickle(stranger, bytes, Duration::from_millis(600), stop)
    });
    let timeout = Duration::from_secs(1);
    let start = Instant::now();
    let err = dist::serve_bytes(listener, 2, &payload(), timeout, None).unwrap_err();
    let waited = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    assert!(matches!(&err, Error::BootstrapTimeout { rank: 0, missing, .. } if missing == &[1]), "{err}");
    assert!(waited >= timeout && waited < timeout + MARGIN, "rank 0 returned after {waited:?}");
    slow.join().unwrap();
}

#[test]
fn a_trickling_rank_0_cannot_hold_a_peer_past_its_deadline() {
    let (listener, addr) = listener();
    let stop = Arc::new(AtomicBool::new(false));
    let server = thread::spawn({
        let stop = stop.clone();
        move || {
            let (stream, _) = listener.accept().unwrap();
            // A well-formed answer announcing 8 bytes, sent a byte at a time.
            let mut bytes = dist::MAGIC.to_vec();
            bytes.push(0);
            bytes.extend_from_slice(&8u32.to_le_bytes());
            bytes.extend_from_slice(&[7; 8]);
            trickle(stream, bytes, Duration::from_millis(600), stop);
        }
    });
    let timeout = Duration::from_secs(1);
    let start = Instant::now();
    let err = dist::fetch_bytes(addr, 1, 2, timeout, None).unwrap_err();
    let waited = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    assert!(matches!(&err, Error::BootstrapTimeout { rank: 1, missing, .. } if missing == &[0]), "{err}");
    assert!(waited >= timeout && waited < timeout + MARGIN, "the peer returned after {waited:?}");
    server.join().unwrap();
}

#[test]
fn silent_connections_do_not_starve_a_real_peer() -> Result<()> {
    let (listener, addr) = listener();
    let start = Instant::now();
    let root = thread::spawn(move || dist::serve_bytes(listener, 2, &payload(), Duration::from_secs(3), None));
    // Connected before the real peer, and never a word: rank 0 must not wait on them in turn.
    let silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    thread::sleep(Duration::from_millis(100));
    assert_eq!(fetch(addr, 1, 2, Duration::from_secs(2)).join().unwrap()?, payload());
    root.join().unwrap()?;
    // Served at once, not after the silent ones had used up the timeout.
    assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
    drop(silent);
    Ok(())
}

#[test]
fn rank_0_reads_at_most_max_pending_hellos_at_once() -> Result<()> {
    let (listener, addr) = listener();
    let root = thread::spawn(move || dist::serve_bytes(listener, 2, &payload(), Duration::from_secs(3), None));
    let extra = 5;
    let mut silent: Vec<TcpStream> =
        (0..dist::MAX_PENDING + extra).map(|_| TcpStream::connect(addr).unwrap()).collect();
    thread::sleep(Duration::from_millis(300));
    // The oldest ones made room for the newer: rank 0 closed them without a word.
    let open = |stream: &mut TcpStream| {
        stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        match stream.read(&mut [0u8; 16]) {
            Ok(0) => false,
            Ok(n) => panic!("a silent connection was sent {n} bytes"),
            Err(e) => {
                assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{e}");
                true
            }
        }
    };
    let still_open: Vec<bool> = silent.iter_mut().take(extra + 1).map(open).collect();
    let mut expected = vec![false; extra];
    expected.push(true);
    assert_eq!(still_open, expected);
    // Rank 0 still takes a real peer, whose connection pushes out another silent one.
    assert_eq!(fetch(addr, 1, 2, Duration::from_secs(2)).join().unwrap()?, payload());
    root.join().unwrap()?;
    Ok(())
}

#[test]
fn a_flood_of_connections_cannot_hold_rank_0_past_its_deadline() {
    let (listener, addr) = listener();
    let stop = Arc::new(AtomicBool::new(false));
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Clients that open silent connections as fast as they can, for 6 s at most, each keeping
    // its latest 50 open (so every one costs rank 0 a wait, yet few are held). A connect stuck
    // on a full backlog is given up at once, so the flood does not pause for SYN retries.
    let flood: Vec<_> = (0..4)
        .map(|_| {
            let (stop, connections) = (stop.clone(), connections.clone());
            thread::spawn(move || {
                let start = Instant::now();
                let mut open = std::collections::VecDeque::new();
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(6) {
                    if let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(50)) {
                        open.push_back(stream);
                        if open.len() > 50 {
                            open.pop_front();
                        }
                        connections.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let timeout = Duration::from_secs(1);
    let start = Instant::now();
    let err = dist::serve_bytes(listener, 2, &payload(), timeout, None).unwrap_err();
    let waited = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    for client in flood {
        client.join().unwrap();
    }
    assert!(matches!(&err, Error::BootstrapTimeout { rank: 0, missing, .. } if missing == &[1]), "{err}");
    assert!(waited < timeout + MARGIN, "rank 0 returned after {waited:?}");
    // It was a flood: far more connections than rank 0 could ever keep.
    assert!(connections.load(Ordering::Relaxed) > 200, "{} connections", connections.load(Ordering::Relaxed));
}

/// A genuine misconfiguration fails every rank, with or without a token: a peer that proves the
/// token is believed about its world size.
#[test]
fn a_peer_with_another_world_size_fails_every_rank() {
    for token in [None, Some(token())] {
        let (listener, addr) = listener();
        let root = thread::spawn({
            let token = token.clone();
            move || dist::serve_bytes(listener, 3, &payload(), LONG, token.as_ref())
        });
        let good = fetch_with(addr, 1, 3, LONG, token.clone());
        thread::sleep(Duration::from_millis(300)); // rank 1 joins first
        let bad = dist::fetch_bytes(addr, 2, 4, LONG, token.as_ref()).unwrap_err();
        let says_why = |r: &str| r.contains("world size 4") && r.contains("rank 0 with 3");
        assert!(matches!(&bad, Error::Bootstrap { rank: 2, reason, .. } if says_why(reason)), "{bad}");
        let err = root.join().unwrap().unwrap_err();
        assert!(matches!(&err, Error::Bootstrap { rank: 0, reason, .. } if says_why(reason)), "{err}");
        let err = good.join().unwrap().unwrap_err();
        assert!(matches!(&err, Error::Bootstrap { rank: 1, reason, .. } if says_why(reason)), "{err}");
    }
}

#[test]
fn two_peers_claiming_one_rank_fail_the_exchange() {
    for token in [None, Some(token())] {
        let (listener, addr) = listener();
        let root = thread::spawn({
            let token = token.clone();
            move || dist::serve_bytes(listener, 3, &payload(), LONG, token.as_ref())
        });
        let first = fetch_with(addr, 1, 3, LONG, token.clone());
        thread::sleep(Duration::from_millis(300));
        let second = dist::fetch_bytes(addr, 1, 3, LONG, token.as_ref()).unwrap_err();
        assert!(
            matches!(&second, Error::Bootstrap { reason, .. } if reason.contains("two peers claim rank 1")),
            "{second}"
        );
        let err = root.join().unwrap().unwrap_err();
        assert!(
            matches!(&err, Error::Bootstrap { rank: 0, reason, .. } if reason.contains("two peers claim rank 1")),
            "{err}"
        );
        assert!(matches!(first.join().unwrap(), Err(Error::Bootstrap { rank: 1, .. })));
    }
}

#[test]
fn with_a_token_four_ranks_share_the_payload() -> Result<()> {
    let addr = free_addr();
    let peers: Vec<_> = (1..4)
        .map(|rank| {
            thread::spawn(move || {
                dist::broadcast_bytes(rank, 4, addr, LONG, Some(&token()), || panic!("only rank 0 makes the payload"))
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let root = dist::broadcast_bytes(0, 4, addr, LONG, Some(&token()), || Ok(payload()))?;
    assert_eq!(root, payload());
    for peer in peers {
        assert_eq!(peer.join().unwrap()?, payload());
    }
    Ok(())
}

/// Before the token, one forged hello was enough to fail every rank, and a stranger claiming a
/// free rank was sent the payload.
#[test]
fn without_the_token_a_stranger_gets_nothing_and_fails_nothing() -> Result<()> {
    let (listener, addr) = listener();
    let root = thread::spawn(move || dist::serve_bytes(listener, 2, &payload(), LONG, Some(&token())));
    let start = Instant::now();
    // A forged hello without a token, claiming another world size: refused, and nothing more.
    let mut forged = TcpStream::connect(addr).unwrap();
    forged.write_all(&forged_hello(1, 99, 0)).unwrap();
    let (status, body) = read_message(&mut forged, false);
    assert_eq!(status, 1, "refused");
    assert!(String::from_utf8_lossy(&body).contains("requires a token"), "{}", String::from_utf8_lossy(&body));
    assert_eq!(rest(&mut forged), b"");
    // One that claims to have the token, for a free rank: a challenge, then a refusal for a
    // guessed proof.
    let mut guesser = TcpStream::connect(addr).unwrap();
    guesser.write_all(&forged_hello(1, 2, 1)).unwrap();
    let (status, challenge) = read_message(&mut guesser, false);
    assert_eq!((status, challenge.len()), (2, 32), "a challenge of 32 bytes");
    guesser.write_all(&[0u8; 32]).unwrap();
    let (status, body) = read_message(&mut guesser, true);
    assert_eq!(status, 1, "refused");
    assert!(String::from_utf8_lossy(&body).contains("does not match"), "{}", String::from_utf8_lossy(&body));
    assert_eq!(rest(&mut guesser), b"");
    // A garbled hello (unknown flags) is not answered at all.
    let mut garbled = TcpStream::connect(addr).unwrap();
    garbled.write_all(&forged_hello(1, 99, 0x80)).unwrap();
    assert_eq!(rest(&mut garbled), b"");
    // Peers with the wrong token, or none, are told why at once.
    let wrong = Token::new("not the secret").unwrap();
    let err = dist::fetch_bytes(addr, 1, 2, LONG, Some(&wrong)).unwrap_err();
    assert!(matches!(&err, Error::Bootstrap { rank: 1, reason, .. } if reason.contains("tokens differ")), "{err}");
    let err = dist::fetch_bytes(addr, 1, 2, LONG, None).unwrap_err();
    assert!(matches!(&err, Error::Bootstrap { rank: 1, reason, .. } if reason.contains("requires a token")), "{err}");
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    // None of them counted: the real rank 1 joins, and rank 0 succeeds.
    assert_eq!(dist::fetch_bytes(addr, 1, 2, LONG, Some(&token()))?, payload());
    root.join().unwrap()?;
    Ok(())
}

#[test]
fn a_token_on_one_side_only_is_refused_without_failing_the_job() -> Result<()> {
    let (listener, addr) = listener();
    let root = thread::spawn(move || dist::serve_bytes(listener, 2, &payload(), LONG, None));
    let err = dist::fetch_bytes(addr, 1, 2, LONG, Some(&token())).unwrap_err();
    assert!(
        matches!(&err, Error::Bootstrap { rank: 1, reason, .. } if reason.contains("rank 0 has no token")),
        "{err}"
    );
    assert_eq!(dist::fetch_bytes(addr, 1, 2, LONG, None)?, payload());
    root.join().unwrap()?;
    Ok(())
}

/// A peer with a token believes only a rank 0 that proves it holds the token too.
#[test]
fn a_peer_with_a_token_takes_no_payload_from_an_impostor() {
    let (listener, addr) = listener();
    let impostor = thread::spawn(move || {
        // First without a challenge, as rank 0 without a token answers.
        let (mut stream, _) = listener.accept().unwrap();
        stream.read_exact(&mut [0u8; HELLO_LEN]).unwrap();
        stream.write_all(&message(0, &payload())).unwrap();
        // Then with a challenge, but a tag it cannot compute.
        let (mut stream, _) = listener.accept().unwrap();
        stream.read_exact(&mut [0u8; HELLO_LEN]).unwrap();
        stream.write_all(&message(2, &[0x33; 32])).unwrap();
        stream.read_exact(&mut [0u8; 32]).unwrap();
        stream.write_all(&[message(0, &payload()), vec![0; 32]].concat()).unwrap();
    });
    let err = dist::fetch_bytes(addr, 1, 2, LONG, Some(&token())).unwrap_err();
    assert!(matches!(&err, Error::Bootstrap { rank: 1, reason, .. } if reason.contains("without proving")), "{err}");
    let err = dist::fetch_bytes(addr, 1, 2, LONG, Some(&token())).unwrap_err();
    assert!(
        matches!(&err, Error::Bootstrap { rank: 1, reason, .. } if reason.contains("does not carry this rank's token")),
        "{err}"
    );
    impostor.join().unwrap();
}

#[test]
fn tokens_must_not_be_empty_and_are_never_shown() {
    let err = Token::new("").unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "Token::new", .. }), "{err}");
    assert!(Token::from_env("OPSMITH_TEST_TOKEN_THAT_IS_NEVER_SET").unwrap().is_none());
    let shown = format!("{:?}", Token::new("hunter2-secret").unwrap());
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[test]
fn a_server_that_is_not_a_bootstrap_is_reported() {
    let (listener, addr) = listener();
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.read_exact(&mut [0u8; HELLO_LEN]).unwrap();
        stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
    });
    let err = dist::fetch_bytes(addr, 1, 2, LONG, None).unwrap_err();
    assert!(
        matches!(&err, Error::Bootstrap { rank: 1, reason, .. } if reason.contains("not an opsmith bootstrap")),
        "{err}"
    );
    server.join().unwrap();
}

#[test]
fn ranks_outside_the_world_are_invalid_arguments() {
    let addr = free_addr();
    let cases = [(3, 3), (0, 0), (5, 2)];
    for (rank, world) in cases {
        let err = dist::broadcast_bytes(rank, world, addr, LONG, None, || Ok(payload())).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "broadcast_bytes", .. }), "{err}");
    }
    let err = dist::fetch_bytes(addr, 0, 2, LONG, None).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "fetch_bytes", .. }), "{err}");
    let (listener, _) = listener();
    let err = dist::serve_bytes(listener, 0, b"", LONG, None).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "serve_bytes", .. }), "{err}");
}

#[test]
fn addresses_come_from_the_environment_or_the_default() -> Result<()> {
    let var = "OPSMITH_TEST_ADDR_THAT_IS_NEVER_SET";
    assert_eq!(dist::addr_from_env(var, "127.0.0.1:29500")?, "127.0.0.1:29500".parse::<SocketAddr>().unwrap());
    assert_eq!(dist::addr_from_env(var, "localhost:29501")?.port(), 29501);
    let err = dist::addr_from_env(var, "no port here").unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "addr_from_env", .. }), "{err}");
    Ok(())
}

#[test]
#[cfg(feature = "nccl")]
fn unique_ids_round_trip_through_their_bytes() {
    let bytes: [u8; 128] = payload().try_into().unwrap();
    assert_eq!(UniqueId::from_bytes(bytes).to_bytes(), bytes);
}

/// cudarc panics when it cannot load libnccl; opsmith must return the typed error instead.
#[test]
#[cfg(feature = "nccl")]
fn missing_nccl_is_an_error_not_a_panic() {
    if dist::nccl_available() {
        println!("skipped: NCCL is installed here");
        return;
    }
    let is_missing =
        |e: &Error| matches!(e, Error::LibraryMissing { lib: "nccl", fix, .. } if fix.contains("libnccl.so"));
    let err = UniqueId::new().unwrap_err();
    assert!(is_missing(&err), "{err}");
    assert!(dist::nccl_version().is_err_and(|e| is_missing(&e)));
    let err = dist::bootstrap_tcp(0, 1, free_addr(), LONG).unwrap_err();
    assert!(is_missing(&err), "{err}");
    let err = Communicator::new(Device::Cuda(0), 0, 1, &UniqueId::from_bytes([0; 128])).unwrap_err();
    assert!(is_missing(&err), "{err}");
}
