//! The rendezvous key-value store: how the processes of a job find each
//! other. Rank 0 serves it on `MASTER_ADDR:MASTER_PORT`; every rank (rank 0
//! too) talks to it over one TCP connection per [`Store`].
//!
//! It carries only small control values: Gloo's peer addresses, PJRT's
//! key-value traffic, each rank's progress for timeout reports. Collective
//! data never goes through it.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tpu_core::{Error, Result};

/// Longest key the server accepts.
const MAX_KEY: usize = 4096;
/// Largest value the server accepts.
const MAX_VALUE: usize = 64 << 20;
/// How long the server's accept loop sleeps between polls for shutdown.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// Slack a client's socket reads get beyond a request's own deadline.
const READ_SLACK: Duration = Duration::from_secs(5);

/// Request and reply tags.
mod tag {
    pub const SET: u8 = 1;
    pub const GET: u8 = 2;
    pub const TRY_GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const OK: u8 = 10;
    pub const FOUND: u8 = 11;
    pub const MISSING: u8 = 12;
    pub const INVALID: u8 = 13;
}

/// A connection to the job's key-value store.
pub struct Store {
    address: String,
    timeout: Duration,
    conn: Mutex<Connection>,
    /// Rank 0's server, stopped when the last handle to it goes.
    server: Option<Arc<Server>>,
}

struct Connection {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

impl Store {
    /// Serves a store on `address` (`host:port`; port 0 picks a free one)
    /// and connects to it.
    pub fn serve(address: &str, timeout: Duration) -> Result<Store> {
        let server = Server::bind(address)?;
        let local = server.address.to_string();
        let mut store = Store::connect(&local, timeout)?;
        store.address = address_with_port(address, server.address.port());
        store.server = Some(server);
        Ok(store)
    }

    /// Connects to the store at `address`, retrying until `timeout` while
    /// its server is not up yet.
    pub fn connect(address: &str, timeout: Duration) -> Result<Store> {
        let deadline = Instant::now() + timeout;
        let fail = rendezvous_error(address);
        let targets: Vec<SocketAddr> = address
            .to_socket_addrs()
            .map_err(|e| fail(format!("cannot resolve the address: {e}")))?
            .collect();
        let stream = loop {
            let attempt = targets.iter().find_map(|a| {
                let left = deadline.saturating_duration_since(Instant::now());
                TcpStream::connect_timeout(a, left.max(Duration::from_millis(1))).ok()
            });
            match attempt {
                Some(stream) => break stream,
                None if Instant::now() >= deadline => {
                    return Err(fail(format!(
                        "no store answered within {} (is rank 0 running?)",
                        seconds(timeout)
                    )));
                }
                None => thread::sleep(Duration::from_millis(20)),
            }
        };
        stream
            .set_nodelay(true)
            .map_err(|e| fail(format!("cannot configure the socket: {e}")))?;
        let reader = stream
            .try_clone()
            .map_err(|e| fail(format!("cannot clone the socket: {e}")))?;
        Ok(Store {
            address: address.to_string(),
            timeout,
            conn: Mutex::new(Connection {
                reader: BufReader::new(reader),
                writer: BufWriter::new(stream),
            }),
            server: None,
        })
    }

    /// A second connection to the same store, for a thread that must not
    /// wait behind this one's blocking gets.
    pub fn reconnect(&self) -> Result<Store> {
        let mut store = Store::connect(&self.address, self.timeout)?;
        store.server = self.server.clone();
        Ok(store)
    }

    /// The store's `host:port`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// This end's IP address on the connection: the interface through
    /// which the store's host reaches this process.
    pub fn local_ip(&self) -> Result<String> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let local = conn.writer.get_ref().local_addr().map_err(|e| {
            rendezvous_error(&self.address)(format!("cannot read the local address: {e}"))
        })?;
        Ok(local.ip().to_string())
    }

    /// The IP address through which this host reaches `host`: what a
    /// store served here should be advertised as to processes there. No
    /// packet is sent (a UDP socket only picks its route).
    pub fn local_ip_towards(host: &str) -> Result<String> {
        let fail = rendezvous_error(host);
        let target = (host, 9)
            .to_socket_addrs()
            .map_err(|e| fail(format!("cannot resolve the host: {e}")))?
            .next()
            .ok_or_else(|| fail("the host resolves to no address".into()))?;
        let any = if target.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        };
        let socket =
            UdpSocket::bind(any).map_err(|e| fail(format!("cannot open a socket: {e}")))?;
        socket
            .connect(target)
            .map_err(|e| fail(format!("no route to the host: {e}")))?;
        let local = socket
            .local_addr()
            .map_err(|e| fail(format!("cannot read the local address: {e}")))?;
        Ok(local.ip().to_string())
    }

    /// How long [`Store::get`] waits for a key.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets `key` to `value`, waking every rank waiting for it.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.check(key, value)?;
        match self.request(tag::SET, key, value, 0, self.timeout)? {
            (tag::OK, _) => Ok(()),
            reply => Err(self.unexpected(reply)),
        }
    }

    /// The value of `key`, waiting up to the store's timeout for a rank to
    /// set it.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_within(key, self.timeout)
    }

    /// The value of `key`, waiting up to `timeout` for a rank to set it.
    pub fn get_within(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.check(key, &[])?;
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        match self.request(tag::GET, key, &[], millis, timeout)? {
            (tag::FOUND, value) => Ok(value),
            (tag::MISSING, _) => Err(rendezvous_error(&self.address)(format!(
                "key `{key}` was not set within {}",
                seconds(timeout)
            ))),
            reply => Err(self.unexpected(reply)),
        }
    }

    /// The value of `key` if a rank has set it.
    pub fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.check(key, &[])?;
        match self.request(tag::TRY_GET, key, &[], 0, self.timeout)? {
            (tag::FOUND, value) => Ok(Some(value)),
            (tag::MISSING, _) => Ok(None),
            reply => Err(self.unexpected(reply)),
        }
    }

    /// Adds `delta` to the integer at `key` (0 when unset) and returns the
    /// new value: a counter every rank can bump atomically.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.check(key, &[])?;
        match self.request(tag::ADD, key, &[], delta as u64, self.timeout)? {
            (tag::FOUND, value) if value.len() == 8 => {
                Ok(i64::from_le_bytes(value.try_into().expect("8 bytes")))
            }
            reply => Err(self.unexpected(reply)),
        }
    }

    fn check(&self, key: &str, value: &[u8]) -> Result<()> {
        if key.len() > MAX_KEY || value.len() > MAX_VALUE {
            return Err(rendezvous_error(&self.address)(format!(
                "a key of {} bytes or a value of {} bytes is over the store's limits ({MAX_KEY} and {MAX_VALUE})",
                key.len(),
                value.len()
            )));
        }
        Ok(())
    }

    /// Sends one request and reads its reply.
    fn request(
        &self,
        tag: u8,
        key: &str,
        value: &[u8],
        arg: u64,
        wait: Duration,
    ) -> Result<(u8, Vec<u8>)> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let Connection { reader, writer } = &mut *conn;
        let fail = rendezvous_error(&self.address);
        let io = |e: std::io::Error| {
            fail(format!(
                "the store connection failed ({e}); did rank 0 exit?"
            ))
        };
        reader
            .get_ref()
            .set_read_timeout(Some(wait.saturating_add(READ_SLACK)))
            .map_err(io)?;
        writer.write_all(&[tag]).map_err(io)?;
        write_bytes(writer, key.as_bytes()).map_err(io)?;
        write_bytes(writer, value).map_err(io)?;
        writer.write_all(&arg.to_le_bytes()).map_err(io)?;
        writer.flush().map_err(io)?;
        let reply = read_u8(reader).map_err(io)?;
        let payload = read_bytes(reader, MAX_VALUE).map_err(io)?;
        Ok((reply, payload))
    }

    fn unexpected(&self, (tag, payload): (u8, Vec<u8>)) -> Error {
        rendezvous_error(&self.address)(if tag == tag::INVALID {
            String::from_utf8_lossy(&payload).into_owned()
        } else {
            format!("the store answered with tag {tag}")
        })
    }
}

/// The keys PJRT's callbacks read and write, under their own prefix.
pub(crate) struct PjrtKeys(pub(crate) Store);

impl tpu_core::pjrt::KeyValueStore for PjrtKeys {
    fn get(&self, key: &str, timeout: Duration) -> std::result::Result<Vec<u8>, String> {
        self.0
            .get_within(&format!("pjrt/{key}"), timeout)
            .map_err(|e| e.to_string())
    }

    fn put(&self, key: &str, value: &[u8]) -> std::result::Result<(), String> {
        self.0
            .set(&format!("pjrt/{key}"), value)
            .map_err(|e| e.to_string())
    }
}

/// The error of a store at `address` failing for a reason.
fn rendezvous_error(address: &str) -> impl Fn(String) -> Error + '_ {
    move |reason| Error::Rendezvous {
        address: address.to_string(),
        reason,
    }
}

/// `address` with its port replaced by `port` (the one picked for port 0).
fn address_with_port(address: &str, port: u16) -> String {
    match address.rsplit_once(':') {
        Some((host, _)) => format!("{host}:{port}"),
        None => format!("{address}:{port}"),
    }
}

/// `30 s`, `1.5 s`.
pub(crate) fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// Rank 0's store: a table and a thread per connection.
struct Server {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct Table {
    values: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl Server {
    fn bind(address: &str) -> Result<Arc<Server>> {
        let fail = rendezvous_error(address);
        let listener =
            TcpListener::bind(address).map_err(|e| fail(format!("cannot listen: {e}")))?;
        let bound = listener
            .local_addr()
            .map_err(|e| fail(format!("cannot read the bound address: {e}")))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| fail(format!("cannot configure the listener: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let table = Arc::new(Table::default());
        let stopping = stop.clone();
        thread::Builder::new()
            .name("tpu-dist-store".into())
            .spawn(move || accept_loop(listener, table, stopping))
            .map_err(|e| fail(format!("cannot start the store thread: {e}")))?;
        Ok(Arc::new(Server {
            address: bound,
            stop,
        }))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn accept_loop(listener: TcpListener, table: Arc<Table>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let table = table.clone();
                let stop = stop.clone();
                let _ = thread::Builder::new()
                    .name("tpu-dist-store-conn".into())
                    .spawn(move || serve_connection(stream, &table, &stop));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Err(e) => {
                tracing::warn!("the rendezvous store stopped accepting: {e}");
                return;
            }
        }
    }
}

/// Answers one client's requests until it disconnects, sends garbage, or
/// the server stops.
fn serve_connection(stream: TcpStream, table: &Table, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_nodelay(true);
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = BufWriter::new(stream);
    while !stop.load(Ordering::Relaxed) {
        let Ok(request) = read_request(&mut reader) else {
            return;
        };
        let (tag, payload) = answer(table, request, stop);
        let sent = writer
            .write_all(&[tag])
            .and_then(|()| write_bytes(&mut writer, &payload))
            .and_then(|()| writer.flush());
        if sent.is_err() {
            return;
        }
    }
}

struct Request {
    tag: u8,
    key: String,
    value: Vec<u8>,
    arg: u64,
}

fn read_request(r: &mut impl Read) -> std::io::Result<Request> {
    let tag = read_u8(r)?;
    let key = read_bytes(r, MAX_KEY)?;
    let value = read_bytes(r, MAX_VALUE)?;
    let mut arg = [0; 8];
    r.read_exact(&mut arg)?;
    let key = String::from_utf8(key)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "key is not UTF-8"))?;
    Ok(Request {
        tag,
        key,
        value,
        arg: u64::from_le_bytes(arg),
    })
}

fn answer(table: &Table, request: Request, stop: &AtomicBool) -> (u8, Vec<u8>) {
    let mut values = table.values.lock().unwrap_or_else(|e| e.into_inner());
    match request.tag {
        tag::SET => {
            values.insert(request.key, request.value);
            table.changed.notify_all();
            (tag::OK, Vec::new())
        }
        tag::TRY_GET => match values.get(&request.key) {
            Some(v) => (tag::FOUND, v.clone()),
            None => (tag::MISSING, Vec::new()),
        },
        tag::GET => {
            let deadline = Instant::now() + Duration::from_millis(request.arg);
            loop {
                if let Some(v) = values.get(&request.key) {
                    return (tag::FOUND, v.clone());
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || stop.load(Ordering::Relaxed) {
                    return (tag::MISSING, Vec::new());
                }
                // Wake at least every 100 ms to notice a stopping server.
                let wait = left.min(Duration::from_millis(100));
                values = table
                    .changed
                    .wait_timeout(values, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        tag::ADD => {
            let old = match values.get(&request.key) {
                None => 0,
                Some(v) if v.len() == 8 => i64::from_le_bytes(v[..].try_into().expect("8 bytes")),
                Some(_) => {
                    return (
                        tag::INVALID,
                        format!("key `{}` does not hold a counter", request.key).into_bytes(),
                    );
                }
            };
            let new = old.wrapping_add(request.arg as i64);
            values.insert(request.key, new.to_le_bytes().to_vec());
            table.changed.notify_all();
            (tag::FOUND, new.to_le_bytes().to_vec())
        }
        other => (
            tag::INVALID,
            format!("unknown request tag {other}").into_bytes(),
        ),
    }
}

fn read_u8(r: &mut impl Read) -> std::io::Result<u8> {
    let mut b = [0];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

fn write_bytes(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(bytes.len()).map_err(std::io::Error::other)?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(bytes)
}

/// A length-prefixed byte string of at most `max` bytes.
fn read_bytes(r: &mut impl Read, max: usize) -> std::io::Result<Vec<u8>> {
    let mut len = [0; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a field of {len} bytes is over the limit of {max}"),
        ));
    }
    let mut out = vec![0; len];
    r.read_exact(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> Store {
        Store::serve("127.0.0.1:0", Duration::from_secs(5)).unwrap()
    }

    #[test]
    fn set_get_try_get_add() {
        let store = served();
        store.set("a", b"one").unwrap();
        assert_eq!(store.get("a").unwrap(), b"one");
        assert_eq!(store.try_get("b").unwrap(), None);
        assert_eq!(store.add("n", 2).unwrap(), 2);
        assert_eq!(store.add("n", -5).unwrap(), -3);
        let err = store.add("a", 1).unwrap_err().to_string();
        assert!(err.contains("does not hold a counter"), "{err}");
    }

    #[test]
    fn get_waits_for_another_connection() {
        let store = served();
        let other = store.reconnect().unwrap();
        let setter = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            other.set("late", b"x").unwrap();
        });
        assert_eq!(store.get("late").unwrap(), b"x");
        setter.join().unwrap();
    }

    #[test]
    fn get_of_a_missing_key_times_out_with_its_name() {
        let store = served();
        let start = Instant::now();
        let err = store
            .get_within("never", Duration::from_millis(100))
            .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(matches!(err, Error::Rendezvous { .. }), "{err}");
        assert!(err.to_string().contains("`never`"), "{err}");
    }

    #[test]
    fn connect_without_a_server_fails_within_the_timeout() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let start = Instant::now();
        let err = Store::connect(&format!("127.0.0.1:{port}"), Duration::from_millis(200))
            .err()
            .unwrap();
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(err.to_string().contains("is rank 0 running"), "{err}");
    }

    #[test]
    fn garbage_from_a_client_closes_only_its_connection() {
        let store = served();
        let mut raw = TcpStream::connect(store.server.as_ref().unwrap().address).unwrap();
        raw.write_all(&[2, 255, 255, 255, 255]).unwrap();
        let mut byte = [0];
        assert_eq!(raw.read(&mut byte).unwrap(), 0, "the server hangs up");
        store.set("still", b"ok").unwrap();
        assert_eq!(store.get("still").unwrap(), b"ok");
    }

    #[test]
    fn oversized_values_are_refused_before_sending() {
        let store = served();
        let err = store.set("big", &vec![0; MAX_VALUE + 1]).unwrap_err();
        assert!(err.to_string().contains("limits"), "{err}");
    }
}
