//! A small HTTP/1.1 server for the integration tests, bound to 127.0.0.1 on
//! a free port. It serves registered routes with `Range`/`If-Range`
//! support, and can require a bearer token, redirect, ignore ranges, throttle,
//! cut a response short once (to exercise resuming), or send a hand-written
//! response (to play a broken or hostile server). Every request is
//! recorded so tests can assert what was (or was not) asked for.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use akunu_hub::FetchOptions;

#[derive(Clone, Default)]
pub struct Route {
    pub status: u16,
    pub body: Vec<u8>,
    pub headers: Vec<(String, String)>,
    /// Serve `Range` requests with 206; when false, always send everything.
    pub ignore_range: bool,
    /// Answer 401 unless `Authorization: Bearer <token>` is sent.
    pub bearer: Option<String>,
    /// Answer 302 to this URL (route headers are still sent).
    pub redirect: Option<String>,
    /// Announce the full length but send only this many body bytes, then
    /// close the connection. Applies to the next response only.
    pub drop_after: Option<usize>,
    /// Pause between 16 KiB writes, to make transfers overlap.
    pub throttle: Option<Duration>,
    /// Send exactly these bytes (status line, headers, body) and close,
    /// whatever was asked.
    pub raw: Option<Vec<u8>>,
}

impl Route {
    pub fn ok(body: Vec<u8>) -> Self {
        Route {
            status: 200,
            body,
            ..Route::default()
        }
    }

    pub fn raw(response: &str) -> Self {
        Route {
            raw: Some(response.as_bytes().to_vec()),
            ..Route::default()
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    fn header_value(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Clone, Debug)]
pub struct Hit {
    pub path: String,
    /// Lowercased names.
    pub headers: HashMap<String, String>,
}

#[derive(Default)]
struct State {
    routes: HashMap<String, Route>,
    hits: Vec<Hit>,
}

pub struct Server {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let state = state.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let state = state.clone();
                    std::thread::spawn(move || handle(conn, &state));
                }
            })
        };
        Server {
            addr,
            state,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn route(&self, path: &str, route: Route) {
        self.state
            .lock()
            .unwrap()
            .routes
            .insert(path.to_string(), route);
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.state.lock().unwrap().hits.clone()
    }

    pub fn hits_for(&self, path: &str) -> Vec<Hit> {
        self.hits().into_iter().filter(|h| h.path == path).collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn handle(mut conn: TcpStream, state: &Mutex<State>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
    let Ok(clone) = conn.try_clone() else { return };
    let mut reader = BufReader::new(clone);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let path = target.split('?').next().unwrap_or("/").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let route = {
        let mut st = state.lock().unwrap();
        st.hits.push(Hit {
            path: path.clone(),
            headers: headers.clone(),
        });
        let route = st.routes.get(&path).cloned();
        // A cut-short response happens once; the next request gets it all.
        if let Some(r) = st.routes.get_mut(&path) {
            r.drop_after = None;
        }
        route
    };
    let Some(route) = route else {
        respond(&mut conn, 404, &[], b"not found", None, None);
        return;
    };
    if let Some(raw) = &route.raw {
        let _ = conn.write_all(raw);
        let _ = conn.flush();
        let _ = conn.shutdown(std::net::Shutdown::Both);
        return;
    }
    if let Some(token) = &route.bearer {
        if headers.get("authorization") != Some(&format!("Bearer {token}")) {
            respond(&mut conn, 401, &[], b"unauthorized", None, None);
            return;
        }
    }
    let mut extra: Vec<(String, String)> = route.headers.clone();
    if let Some(to) = &route.redirect {
        extra.push(("Location".into(), to.clone()));
        respond(&mut conn, 302, &extra, b"", None, None);
        return;
    }
    if route.status != 200 {
        respond(&mut conn, route.status, &extra, &route.body, None, None);
        return;
    }
    let len = route.body.len();
    let if_range_ok = match headers.get("if-range") {
        None => true,
        Some(v) => route.header_value("etag") == Some(v.as_str()),
    };
    let range_start = headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    let (status, body) = match range_start {
        Some(start) if !route.ignore_range && if_range_ok => {
            if start >= len {
                extra.push(("Content-Range".into(), format!("bytes */{len}")));
                respond(&mut conn, 416, &extra, b"", None, None);
                return;
            }
            extra.push((
                "Content-Range".into(),
                format!("bytes {start}-{}/{len}", len - 1),
            ));
            (206, &route.body[start..])
        }
        _ => (200, &route.body[..]),
    };
    respond(
        &mut conn,
        status,
        &extra,
        body,
        route.drop_after,
        route.throttle,
    );
}

fn respond(
    conn: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    drop_after: Option<usize>,
    throttle: Option<Duration>,
) {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    if conn.write_all(head.as_bytes()).is_err() {
        return;
    }
    let send = drop_after.unwrap_or(body.len()).min(body.len());
    for chunk in body[..send].chunks(16 << 10) {
        if conn.write_all(chunk).is_err() {
            return;
        }
        if let Some(d) = throttle {
            std::thread::sleep(d);
        }
    }
    let _ = conn.flush();
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

/// Deterministic pseudo-random bytes with no zero byte.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 255) as u8 + 1
        })
        .collect()
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Quiet, no retries, short timeouts, everything pointed at `server`.
pub fn options(cache: &Path, server: &Server) -> FetchOptions {
    FetchOptions {
        cache_dir: Some(cache.to_path_buf()),
        pypi_url: server.url(""),
        hf_endpoint: server.url(""),
        hf_token: None,
        sha256: None,
        quiet: true,
        verify_cached: false,
        retries: 0,
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(5),
    }
}

/// First file called `name` anywhere under `dir`.
pub fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()? {
        let path = entry.ok()?.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}
