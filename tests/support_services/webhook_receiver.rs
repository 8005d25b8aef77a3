//! A webhook receiver on loopback for the tests of webhook delivery (#42):
//! a small HTTP/1.1 server on a tokio `TcpListener` (127.0.0.1:0) rather
//! than axum, so that it can also hang after reading a request or close
//! the connection without answering. It answers as its script says, and
//! records every request it read and what it answered.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use stead::adapters::webhook::{EVENT_ID_HEADER, SIGNATURE_HEADER};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Largest request the receiver reads.
const REQUEST_LEN_MAX: usize = 64 * 1024;

/// What the receiver does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Ok,
    Status500,
    /// Reads the request and never answers.
    Hang,
    /// Reads the request and closes the connection without answering.
    Close,
    /// Reads the request, and answers 200 once [`Receiver::release`] is
    /// called (recorded as `Held` until then, as `Ok` after).
    Held,
}

/// One request as the receiver read it.
#[derive(Clone, Debug)]
pub struct Request {
    pub event_id: i64,
    /// The event's kind, from a `format = "stead"` body.
    pub kind: Option<String>,
    pub signature: Option<String>,
    pub body: Vec<u8>,
}

/// How the receiver answers: the requests it scripts (all, or those of one
/// event kind) get the script's answers in turn, then `then`; any other
/// request gets 200.
struct Rules {
    kind: Option<String>,
    script: VecDeque<Answer>,
    then: Answer,
}

/// A webhook receiver on loopback (see the module's doc).
#[derive(Clone)]
pub struct Receiver {
    rules: Arc<Mutex<Rules>>,
    /// Every request read, with what it was answered.
    answered: Arc<Mutex<Vec<(Request, Answer)>>>,
    /// Turns true when held requests may be answered.
    released: Arc<watch::Sender<bool>>,
}

impl Receiver {
    /// Serves on 127.0.0.1:0, answering every request as `script` says,
    /// then 200; returns the receiver and its URL.
    pub async fn start(script: &[Answer]) -> (Self, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let receiver = Receiver {
            rules: Arc::new(Mutex::new(Rules {
                kind: None,
                script: script.iter().copied().collect(),
                then: Answer::Ok,
            })),
            answered: Arc::default(),
            released: Arc::new(watch::channel(false).0),
        };
        let serving = receiver.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let receiver = serving.clone();
                tokio::spawn(async move { receiver.serve(stream).await });
            }
        });
        (receiver, url)
    }

    /// From now on, the events of `kind` get `script`'s answers in turn,
    /// then `then`; every other request gets 200.
    pub fn script_kind(&self, kind: &str, script: &[Answer], then: Answer) {
        *self.rules.lock().unwrap() = Rules {
            kind: Some(kind.to_owned()),
            script: script.iter().copied().collect(),
            then,
        };
    }

    async fn serve(&self, mut stream: TcpStream) {
        let Some(request) = read_request(&mut stream).await else {
            return;
        };
        let answer = {
            let mut rules = self.rules.lock().unwrap();
            let scripted = rules
                .kind
                .as_ref()
                .is_none_or(|kind| request.kind.as_ref() == Some(kind));
            if scripted {
                let then = rules.then;
                rules.script.pop_front().unwrap_or(then)
            } else {
                Answer::Ok
            }
        };
        // Recorded before the answer: once the sender has it, so does the test.
        let at = {
            let mut answered = self.answered.lock().unwrap();
            answered.push((request, answer));
            answered.len() - 1
        };
        match answer {
            Answer::Held => {
                let mut released = self.released.subscribe();
                let _ = released.wait_for(|r| *r).await;
                self.answered.lock().unwrap()[at].1 = Answer::Ok;
                respond(&mut stream, "200 OK").await;
            }
            Answer::Ok => respond(&mut stream, "200 OK").await,
            Answer::Status500 => respond(&mut stream, "500 Internal Server Error").await,
            Answer::Hang => {
                // Holds the connection open, answering nothing.
                std::future::pending::<()>().await;
            }
            Answer::Close => drop(stream),
        }
    }

    /// Lets every held request (and any later one) be answered 200.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// Every request read, with its answer, in the order they came.
    pub fn answered(&self) -> Vec<(Request, Answer)> {
        self.answered.lock().unwrap().clone()
    }

    /// The requests answered 200.
    pub fn acknowledged(&self) -> Vec<Request> {
        self.answered()
            .into_iter()
            .filter(|(_, a)| *a == Answer::Ok)
            .map(|(r, _)| r)
            .collect()
    }

    /// The event ids of the requests answered 200.
    pub fn acknowledged_ids(&self) -> Vec<i64> {
        self.acknowledged().iter().map(|r| r.event_id).collect()
    }

    /// The event ids of every request read, whatever the answer.
    pub fn attempted_ids(&self) -> Vec<i64> {
        self.answered().iter().map(|(r, _)| r.event_id).collect()
    }
}

async fn respond(stream: &mut TcpStream, status: &str) {
    let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Reads one request: its head, then as many body bytes as it declares.
async fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buffer.len() > REQUEST_LEN_MAX {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let header = |name: &str| {
        head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    };
    let length: usize = header("content-length")?.parse().ok()?;
    while buffer.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[head_end..head_end + length].to_vec();
    let kind = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["event"]["kind"].as_str().map(str::to_owned));
    Some(Request {
        event_id: header(EVENT_ID_HEADER)?.parse().ok()?,
        kind,
        signature: header(SIGNATURE_HEADER),
        body,
    })
}
