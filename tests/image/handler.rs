//! The handler of tests/image.rs: one static binary (std only, built with `rustc --target
//! x86_64-unknown-linux-musl`) for an image that holds nothing else, no C library and no shell.
//!
//! Run by qc-worker's exec layout (QC_MESSAGE_ID set): reads the body from stdin, records the message id,
//! exits 0. Run as the image's entrypoint otherwise: an HTTP/1.1 server on 127.0.0.1:$PORT (default 8080)
//! that answers each POST with 204 after recording its `ce-id` header, and GET /healthz with 200.
//!
//! Records go to $SEEN_FILE (default /seen/ids), one id a line, appended with a single write each, so the
//! test counts what the handler really saw; beside it, `receipts` gets "ID RECEIVE_COUNT HOSTNAME UNIX_MILLIS" a line,
//! so a test can tell a message SQS (or moto) delivered twice from one a worker handled twice; and
//! `started` the same when a message's handling begins, so a handling cut short shows as a start without
//! its receipt. A body containing `slow` is answered after 2 seconds, so the
//! test can stop the pod while messages are in flight. As a container's PID 1 it ignores SIGTERM (no
//! handler is installed), like a handler held up by the preStop hook the controller renders: it keeps
//! serving while the worker drains. Over HTTP, a body containing `linger` is answered after 8 seconds.
//!
//! Its "dependency" is down while a file `down` exists beside $SEEN_FILE: every message is then answered
//! with 503 (exec: exit 75) and not recorded, as a handler whose database is unreachable would.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn seen_file() -> File {
    let path = seen_path();
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| fail(&format!("cannot open {path}: {e}")))
}

fn seen_path() -> String {
    std::env::var("SEEN_FILE").unwrap_or_else(|_| "/seen/ids".to_string())
}

fn dependency_down() -> bool {
    std::path::Path::new(&seen_path())
        .with_file_name("down")
        .exists()
}

fn fail(msg: &str) -> ! {
    eprintln!("handler: {msg}");
    std::process::exit(1)
}

/// "ID RECEIVE_COUNT HOSTNAME UNIX_MILLIS" appended to the file `name` beside $SEEN_FILE.
fn note(name: &str, id: &str, receive_count: &str) {
    let path = std::path::Path::new(&seen_path()).with_file_name(name);
    let host = std::env::var("HOSTNAME").unwrap_or_default();
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let line = format!("{id} {receive_count} {host} {ms}\n");
    let written = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        fail(&format!("cannot record {id} in {}: {e}", path.display()));
    }
}

fn record(file: &mut File, id: &str, receive_count: &str) {
    // One write of the whole line: O_APPEND keeps lines of concurrent writers whole.
    if let Err(e) = file.write_all(format!("{id}\n").as_bytes()) {
        fail(&format!("cannot record {id}: {e}"));
    }
    note("receipts", id, receive_count);
}

fn main() {
    if let Ok(id) = std::env::var("QC_MESSAGE_ID") {
        let mut body = Vec::new();
        if let Err(e) = std::io::stdin().read_to_end(&mut body) {
            fail(&format!("cannot read the body: {e}"));
        }
        if dependency_down() {
            eprintln!("handler: dependency down, {id} not handled");
            std::process::exit(75);
        }
        let count = std::env::var("QC_RECEIVE_COUNT").unwrap_or_default();
        note("started", &id, &count);
        if contains(&body, b"slow") {
            std::thread::sleep(Duration::from_secs(2));
        }
        record(&mut seen_file(), &id, &count);
        return;
    }
    let port = std::env::var("PORT").unwrap_or_else(|_| "8080".to_string());
    let listener = TcpListener::bind(format!("127.0.0.1:{port}"))
        .unwrap_or_else(|e| fail(&format!("cannot listen on 127.0.0.1:{port}: {e}")));
    let seen = Arc::new(Mutex::new(seen_file()));
    eprintln!("handler: listening on 127.0.0.1:{port}");
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let seen = Arc::clone(&seen);
        std::thread::spawn(move || serve(stream, &seen));
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Requests of one keep-alive connection, until the peer closes it or sends something unreadable.
fn serve(stream: TcpStream, seen: &Mutex<File>) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        match reader.read_line(&mut request_line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut parts = request_line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let (mut length, mut id, mut close, mut count) = (0usize, None, false, String::new());
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                let value = value.trim();
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.parse().unwrap_or(0),
                    "ce-id" => id = Some(value.to_string()),
                    "ce-sqsreceivecount" => count = value.to_string(),
                    "connection" => close = value.eq_ignore_ascii_case("close"),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let status = match (method.as_str(), id) {
            ("POST", Some(_)) if dependency_down() => "503 Service Unavailable",
            ("POST", Some(id)) => {
                note("started", &id, &count);
                if contains(&body, b"linger") {
                    std::thread::sleep(Duration::from_secs(8));
                } else if contains(&body, b"slow") {
                    std::thread::sleep(Duration::from_secs(2));
                }
                match seen.lock() {
                    Ok(mut file) => record(&mut file, &id, &count),
                    Err(_) => fail("a writer panicked"),
                }
                "204 No Content"
            }
            ("POST", None) => "400 Bad Request",
            ("GET", _) if path == "/healthz" => "200 OK",
            _ => "404 Not Found",
        };
        let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
        if out.write_all(answer.as_bytes()).is_err() || close {
            return;
        }
    }
}
