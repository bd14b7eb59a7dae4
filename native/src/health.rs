//! `grpc.health.v1.Health`, answered natively from the statuses Python sets, with grpcio's semantics:
//! `Check` of a service never set is NOT_FOUND, `Watch` of one sends SERVICE_UNKNOWN, and after
//! [`Health::shutdown`] (grpcio's `enter_graceful_shutdown`) every service set is NOT_SERVING for good.
//!
//! A `Watch` sends the current status at once, then one message per change, until the client goes
//! away, its deadline passes (DEADLINE_EXCEEDED), or the front stops (UNAVAILABLE, so the client
//! reconnects to whatever serves next).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::conn::Conn;
use crate::grpc::{self, Status};
use crate::wire;

pub const SERVICE: &str = "grpc.health.v1.Health";
pub const NOT_SERVING: i32 = 2;
pub const SERVICE_UNKNOWN: i32 = 3;

#[derive(Default)]
pub struct Health {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Per service: its status, `None` while never set (a `Watch` is waiting for it).
    services: HashMap<String, watch::Sender<Option<i32>>>,
    shut_down: bool,
}

impl Health {
    pub fn set(&self, service: &str, status: i32) {
        let mut state = self.state.lock().expect("health lock");
        if state.shut_down {
            return;
        }
        match state.services.get(service) {
            Some(sender) => {
                sender.send_if_modified(|current| current.replace(status) != Some(status));
            }
            None => {
                state
                    .services
                    .insert(service.to_string(), watch::Sender::new(Some(status)));
            }
        }
    }

    /// Every service set is NOT_SERVING from now on, whatever `set` says later.
    pub fn shutdown(&self) {
        let mut state = self.state.lock().expect("health lock");
        for sender in state.services.values() {
            sender.send_if_modified(|current| match current {
                Some(status) if *status != NOT_SERVING => {
                    *status = NOT_SERVING;
                    true
                }
                _ => false,
            });
        }
        state.shut_down = true;
    }

    /// The status of a service set at least once.
    pub fn check(&self, service: &str) -> Option<i32> {
        let state = self.state.lock().expect("health lock");
        state.services.get(service).and_then(|sender| *sender.borrow())
    }

    /// The status of `service` now and as it changes (`None`: never set).
    pub fn watch(&self, service: &str) -> watch::Receiver<Option<i32>> {
        let mut state = self.state.lock().expect("health lock");
        if let Some(sender) = state.services.get(service) {
            return sender.subscribe();
        }
        // Forget the never-set services nobody watches any more: clients may watch any name.
        state
            .services
            .retain(|_, sender| sender.borrow().is_some() || sender.receiver_count() > 0);
        let sender = watch::Sender::new(None);
        let receiver = sender.subscribe();
        state.services.insert(service.to_string(), sender);
        receiver
    }
}

/// The service a HealthCheckRequest names.
pub fn requested_service(request: &[u8]) -> Result<String, Status> {
    if !wire::plain(request, wire::ID_REQUEST) {
        return Err(Status::new(
            grpc::INVALID_ARGUMENT,
            "the request is not a valid grpc.health.v1.HealthCheckRequest",
        ));
    }
    Ok(String::from_utf8_lossy(wire::bytes_of(request, 1)).into_owned())
}

/// A HealthCheckResponse.
pub fn response(status: i32) -> Bytes {
    let mut out = Vec::with_capacity(2);
    if status != 0 {
        wire::put_varint_field(&mut out, 1, status as i64 as u64);
    }
    Bytes::from(out)
}

/// The answer to `Check`.
pub fn check(health: &Health, request: &[u8]) -> Result<Bytes, Status> {
    let service = requested_service(request)?;
    match health.check(&service) {
        Some(status) => Ok(response(status)),
        None => Err(Status::new(grpc::NOT_FOUND, "unknown service")),
    }
}

/// What ends a `Watch` besides the client: its deadline, the front stopping, its connection asked
/// to go away (the client then watches again on a new connection).
pub struct Ends {
    pub deadline: Option<Instant>,
    pub stopping: watch::Receiver<Option<Duration>>,
    pub conn: Arc<Conn>,
}

/// Feed a `Watch` answer until the client leaves or one of `ends` comes.
pub async fn watch_stream(mut statuses: watch::Receiver<Option<i32>>, stream: grpc::Stream, ends: Ends) {
    let Ends {
        deadline,
        mut stopping,
        conn,
    } = ends;
    let far = Instant::now() + Duration::from_secs(86400 * 365);
    let until = deadline.unwrap_or(far);
    let expired = || Status::new(grpc::DEADLINE_EXCEEDED, "Deadline Exceeded");
    let mut last = None;
    let end = loop {
        let current = statuses.borrow_and_update().unwrap_or(SERVICE_UNKNOWN);
        if last != Some(current) {
            // A client that reads nothing does not hold the stream past its deadline either.
            let message = response(current);
            tokio::select! {
                sent = stream.send(&message) => if !sent { return },
                () = tokio::time::sleep_until(until) => break expired(),
            }
            last = Some(current);
        }
        let stopped = tokio::select! {
            changed = statuses.changed() => if changed.is_err() { break Status::new(grpc::UNAVAILABLE, "the server is stopping") } else { false },
            _ = stopping.wait_for(Option::is_some) => true,
            _ = conn.going_away() => break Status::new(grpc::UNAVAILABLE, "the server is closing this connection; watch again"),
            () = tokio::time::sleep_until(until) => break expired(),
            () = stream.closed() => return,
        };
        if stopped {
            // A drain sets NOT_SERVING just before the front stops, and select! picks either branch
            // when both are ready: send the last status first, so that the client sees it.
            let current = statuses.borrow_and_update().unwrap_or(SERVICE_UNKNOWN);
            if last != Some(current) && !stream.send(&response(current)).await {
                return;
            }
            break Status::new(grpc::UNAVAILABLE, "the server is stopping");
        }
    };
    stream.finish(end).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_knows_only_the_services_set_and_shutdown_is_for_good() {
        let h = Health::default();
        assert_eq!(h.check(""), None);
        h.set("", 1);
        h.set("backend/a", 1);
        assert_eq!(h.check(""), Some(1));
        let watched = h.watch("never-set");
        assert_eq!(*watched.borrow(), None);
        assert_eq!(h.check("never-set"), None, "watching does not make a service known");
        h.shutdown();
        assert_eq!(h.check(""), Some(NOT_SERVING));
        assert_eq!(h.check("backend/a"), Some(NOT_SERVING));
        h.set("", 1);
        h.set("new", 1);
        assert_eq!(h.check(""), Some(NOT_SERVING), "set after shutdown is ignored");
        assert_eq!(h.check("new"), None);
        assert_eq!(h.check("never-set"), None, "shutdown leaves unknown services unknown");
    }

    #[test]
    fn watchers_see_changes_only() {
        let h = Health::default();
        h.set("s", 1);
        let mut rx = h.watch("s");
        assert_eq!(*rx.borrow_and_update(), Some(1));
        h.set("s", 1);
        assert!(!rx.has_changed().unwrap(), "the same status again is no change");
        h.set("s", 2);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), Some(2));

        let mut later = h.watch("later");
        h.set("later", 1);
        assert_eq!(
            *later.borrow_and_update(),
            Some(1),
            "a watch before the first set sees it"
        );
    }

    #[test]
    fn unwatched_unknown_services_are_forgotten() {
        let h = Health::default();
        drop(h.watch("a"));
        let _kept = h.watch("b");
        let _ = h.watch("c");
        let names: Vec<String> = h.state.lock().unwrap().services.keys().cloned().collect();
        assert!(
            !names.contains(&"a".to_string()) && names.contains(&"b".to_string()),
            "{names:?}"
        );
    }

    /// The frames of a streamed answer: each message's bytes, then the trailers' grpc-status.
    async fn next(body: &mut grpc::ResponseBody) -> String {
        use http_body_util::BodyExt;
        let frame = body.frame().await.expect("a frame").unwrap();
        match frame.into_data() {
            Ok(data) => format!("message {:?}", &data[5..]),
            Err(frame) => format!("status {:?}", frame.into_trailers().unwrap()["grpc-status"]),
        }
    }

    #[tokio::test]
    async fn a_watch_sends_the_status_then_each_change_and_ends_when_the_front_stops() {
        let h = Health::default();
        let (stop, stopping) = watch::channel(None);
        let (response, stream) = grpc::streamed();
        let mut body = response.into_body();
        let ends = Ends {
            deadline: None,
            stopping,
            conn: Conn::detached(),
        };
        tokio::spawn(watch_stream(h.watch("s"), stream, ends));
        assert_eq!(
            next(&mut body).await,
            "message [8, 3]",
            "SERVICE_UNKNOWN while never set"
        );
        h.set("s", 1);
        h.set("s", 1);
        h.set("s", 2);
        let mut seen = vec![next(&mut body).await];
        if seen[0] != "message [8, 2]" {
            seen.push(next(&mut body).await); // the task may have seen 1 before 2 was set
        }
        assert_eq!(seen.last().unwrap(), "message [8, 2]", "{seen:?}");
        stop.send(Some(Duration::ZERO)).unwrap();
        assert_eq!(next(&mut body).await, "status \"14\"");
    }

    #[tokio::test]
    async fn a_watch_sees_not_serving_when_a_drain_stops_the_front_at_once() {
        // Shutdown and stop come together; many rounds, since select! picks a ready branch at random.
        for _ in 0..64 {
            let h = Health::default();
            h.set("", 1);
            let (stop, stopping) = watch::channel(None);
            let (response, stream) = grpc::streamed();
            let mut body = response.into_body();
            let ends = Ends {
                deadline: None,
                stopping,
                conn: Conn::detached(),
            };
            tokio::spawn(watch_stream(h.watch(""), stream, ends));
            assert_eq!(next(&mut body).await, "message [8, 1]");
            h.shutdown();
            stop.send(Some(Duration::ZERO)).unwrap();
            assert_eq!(next(&mut body).await, "message [8, 2]");
            assert_eq!(next(&mut body).await, "status \"14\"");
        }
    }

    #[tokio::test]
    async fn a_watch_ends_at_its_deadline() {
        let h = Health::default();
        h.set("", 1);
        let (_stop, stopping) = watch::channel(None);
        let (response, stream) = grpc::streamed();
        let mut body = response.into_body();
        let deadline = Instant::now() + Duration::from_millis(20);
        let ends = Ends {
            deadline: Some(deadline),
            stopping,
            conn: Conn::detached(),
        };
        tokio::spawn(watch_stream(h.watch(""), stream, ends));
        assert_eq!(next(&mut body).await, "message [8, 1]");
        assert_eq!(next(&mut body).await, "status \"4\"");
    }

    #[test]
    fn decodes_requests_and_encodes_responses() {
        let mut request = Vec::new();
        wire::put_bytes_field(&mut request, 1, b"grpc.health.v1.Health");
        assert_eq!(requested_service(&request).unwrap(), "grpc.health.v1.Health");
        assert_eq!(requested_service(&[]).unwrap(), "");
        assert_eq!(requested_service(&[0x0a, 5]).unwrap_err().code, grpc::INVALID_ARGUMENT);
        assert_eq!(&response(0)[..], b"");
        assert_eq!(&response(1)[..], [0x08, 1]);
        let h = Health::default();
        assert_eq!(
            check(&h, &[]).unwrap_err(),
            Status::new(grpc::NOT_FOUND, "unknown service")
        );
        h.set("", 1);
        assert_eq!(&check(&h, &[]).unwrap()[..], [0x08, 1]);
    }
}
