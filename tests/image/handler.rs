//! The handler of tests/image.rs: one static binary (std only, built with `rustc --target
//! x86_64-unknown-linux-musl`) for an image that holds nothing else, no C library and no shell.
//!
//! Run by qc-worker's exec layout (QC_MESSAGE_ID set): reads the body from stdin, records the message id,
//! exits 0. Run as the image's entrypoint otherwise: an HTTP/1.1 server on 127.0.0.1:$PORT (default 8080)
//! that answers each POST with 204 after recording its `ce-id` header, and GET /healthz with 200.
//!
//! Records go to $SEEN_FILE (default /seen/ids), one id a line, appended with a single write each, so the
//! test counts what the handler really saw. A body containing `slow` is answered after 2 seconds, so the
//! test can stop the pod while messages are in flight. As a container's PID 1 it ignores SIGTERM (no
//! handler is installed), like a handler held up by the preStop hook the controller renders: it keeps
//! serving while the worker drains.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn seen_file() -> File {
    let path = std::env::var("SEEN_FILE").unwrap_or_else(|_| "/seen/ids".to_string());
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| fail(&format!("cannot open {path}: {e}")))
}

fn fail(msg: &str) -> ! {
    eprintln!("handler: {msg}");
    std::process::exit(1)
}

fn record(file: &mut File, id: &str) {
    // One write of the whole line: O_APPEND keeps lines of concurrent writers whole.
    if let Err(e) = file.write_all(format!("{id}\n").as_bytes()) {
        fail(&format!("cannot record {id}: {e}"));
    }
}

fn main() {
    if let Ok(id) = std::env::var("QC_MESSAGE_ID") {
        let mut body = Vec::new();
        if let Err(e) = std::io::stdin().read_to_end(&mut body) {
            fail(&format!("cannot read the body: {e}"));
        }
        if contains(&body, b"slow") {
            std::thread::sleep(Duration::from_secs(2));
        }
        record(&mut seen_file(), &id);
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
        let (mut length, mut id, mut close) = (0usize, None, false);
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
            ("POST", Some(id)) => {
                if contains(&body, b"slow") {
                    std::thread::sleep(Duration::from_secs(2));
                }
                match seen.lock() {
                    Ok(mut file) => record(&mut file, &id),
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
