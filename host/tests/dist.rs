//! The TCP bootstrap of `opsmith_host::dist`, over loopback and without NCCL, and the typed
//! error that replaces cudarc's panic when NCCL is missing.
#[cfg(feature = "nccl")]
use opsmith_host::Device;
use opsmith_host::dist;
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
    thread::spawn(move || dist::fetch_bytes(addr, rank, world, timeout))
}

#[test]
fn four_ranks_share_the_payload_over_loopback() -> Result<()> {
    let addr = free_addr();
    // The other ranks start first, so they must retry until rank 0 listens.
    let peers: Vec<_> = (1..4)
        .map(|rank| {
            thread::spawn(move || {
                dist::broadcast_bytes(rank, 4, addr, LONG, || panic!("only rank 0 makes the payload"))
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let root = dist::broadcast_bytes(0, 4, addr, LONG, || Ok(payload()))?;
    assert_eq!(root, payload());
    for peer in peers {
        assert_eq!(peer.join().unwrap()?, payload());
    }
    Ok(())
}

#[test]
fn a_world_of_one_needs_no_network() -> Result<()> {
    // Nothing listens: the address is not even bound.
    let got = dist::broadcast_bytes(0, 1, free_addr(), Duration::from_millis(1), || Ok(payload()))?;
    assert_eq!(got, payload());
    Ok(())
}

#[test]
fn a_peer_without_rank_0_times_out() {
    let addr = free_addr();
    let start = Instant::now();
    let err = dist::fetch_bytes(addr, 2, 3, Duration::from_millis(300)).unwrap_err();
    let waited = start.elapsed();
    assert!(
        matches!(&err, Error::BootstrapTimeout { rank: 2, addr: a, missing, .. } if *a == addr && missing == &[0]),
        "{err}"
    );
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(10), "waited {waited:?}");
}

#[test]
fn rank_0_times_out_naming_the_missing_ranks_and_releases_the_others() {
    let (listener, addr) = listener();
    let joined = fetch(addr, 2, 4, LONG);
    let err = dist::serve_bytes(listener, 4, &payload(), Duration::from_millis(500)).unwrap_err();
    assert!(matches!(&err, Error::BootstrapTimeout { rank: 0, missing, .. } if missing == &[1, 3]), "{err}");
    // Rank 2 had joined: it hears at once that rank 0 gave up, instead of waiting out its own 20 s.
    let start = Instant::now();
    let err = joined.join().unwrap().unwrap_err();
    assert!(matches!(&err, Error::Bootstrap { rank: 2, reason, .. } if reason.contains("timed out")), "{err}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn strangers_on_the_port_are_ignored() -> Result<()> {
    let (listener, addr) = listener();
    let root = thread::spawn(move || dist::serve_bytes(listener, 2, &payload(), LONG));
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
    let err = dist::serve_bytes(listener, 2, &payload(), timeout).unwrap_err();
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
    let err = dist::fetch_bytes(addr, 1, 2, timeout).unwrap_err();
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
    let root = thread::spawn(move || dist::serve_bytes(listener, 2, &payload(), Duration::from_secs(3)));
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
    let root = thread::spawn(move || dist::serve_bytes(listener, 2, &payload(), Duration::from_secs(3)));
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
    let err = dist::serve_bytes(listener, 2, &payload(), timeout).unwrap_err();
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

#[test]
fn a_peer_with_another_world_size_fails_every_rank() {
    let (listener, addr) = listener();
    let root = thread::spawn(move || dist::serve_bytes(listener, 3, &payload(), LONG));
    let good = fetch(addr, 1, 3, LONG);
    thread::sleep(Duration::from_millis(300)); // rank 1 joins first
    let bad = dist::fetch_bytes(addr, 2, 4, LONG).unwrap_err();
    let says_why = |r: &str| r.contains("world size 4") && r.contains("rank 0 with 3");
    assert!(matches!(&bad, Error::Bootstrap { rank: 2, reason, .. } if says_why(reason)), "{bad}");
    let err = root.join().unwrap().unwrap_err();
    assert!(matches!(&err, Error::Bootstrap { rank: 0, reason, .. } if says_why(reason)), "{err}");
    let err = good.join().unwrap().unwrap_err();
    assert!(matches!(&err, Error::Bootstrap { rank: 1, reason, .. } if says_why(reason)), "{err}");
}

#[test]
fn two_peers_claiming_one_rank_fail_the_exchange() {
    let (listener, addr) = listener();
    let root = thread::spawn(move || dist::serve_bytes(listener, 3, &payload(), LONG));
    let first = fetch(addr, 1, 3, LONG);
    thread::sleep(Duration::from_millis(300));
    let second = dist::fetch_bytes(addr, 1, 3, LONG).unwrap_err();
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

#[test]
fn a_server_that_is_not_a_bootstrap_is_reported() {
    let (listener, addr) = listener();
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut hello = [0u8; 16];
        stream.read_exact(&mut hello).unwrap();
        stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
    });
    let err = dist::fetch_bytes(addr, 1, 2, LONG).unwrap_err();
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
        let err = dist::broadcast_bytes(rank, world, addr, LONG, || Ok(payload())).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "broadcast_bytes", .. }), "{err}");
    }
    let err = dist::fetch_bytes(addr, 0, 2, LONG).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "fetch_bytes", .. }), "{err}");
    let (listener, _) = listener();
    let err = dist::serve_bytes(listener, 0, b"", LONG).unwrap_err();
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
