//! The attaches a replica holds open to ready pool pods' launchers, by pod (docs/contract.md
//! "A claim writes its start on an attach held open"): being opened, or open; taken once by a
//! claim, never one whose stream ended; at most [`HELD_AT_MOST`]. No I/O: the pools'
//! controller opens and lets go of them (`crate::controller::pools::attaches`), a claim writes
//! on the one it takes (`crate::controller::run::act`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::FutureExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::AttachedProcess;
use tokio::io::{SimplexStream, WriteHalf};

/// The most attaches a replica holds open (a pod beyond them is attached to at its claim).
pub const HELD_AT_MOST: usize = 512;
/// How many attaches are being opened at once.
pub const OPENS_AT_ONCE: usize = 4;

/// What an attach ends with: the status its stream closes with (None: none came).
pub(crate) type Ending = Pin<Box<dyn Future<Output = Option<Status>> + Send>>;

/// An attach held open to a pool pod's launcher: its stdin, the status it ends with, and the
/// process that carries both (dropped: the stream is closed).
pub(crate) struct HeldAttach {
    uid: String,
    stdin: WriteHalf<SimplexStream>,
    status: Ending,
    /// None only in tests.
    process: Option<AttachedProcess>,
}

impl HeldAttach {
    /// An attach to the pod of `uid`, opened: its stdin, its ending, its process.
    pub(crate) fn new(
        uid: String,
        stdin: WriteHalf<SimplexStream>,
        status: Ending,
        process: Option<AttachedProcess>,
    ) -> HeldAttach {
        HeldAttach {
            uid,
            stdin,
            status,
            process,
        }
    }

    /// The attach's stdin, the status it ends with, and the process to keep while they are used.
    pub(crate) fn into_parts(self) -> (WriteHalf<SimplexStream>, Ending, Option<AttachedProcess>) {
        (self.stdin, self.status, self.process)
    }

    /// Whether the stream already ended (the kubelet's idle timeout, a lost connection).
    fn ended(&mut self) -> bool {
        self.status.as_mut().now_or_never().is_some()
    }
}

/// One pod's entry: being opened, or open.
enum Entry {
    Opening { uid: String },
    Open(HeldAttach),
}

/// The attaches held open, by (namespace, pod name).
pub(crate) struct HeldAttaches {
    entries: Mutex<HashMap<(String, String), Entry>>,
    opens: Arc<tokio::sync::Semaphore>,
}

impl Default for HeldAttaches {
    fn default() -> HeldAttaches {
        HeldAttaches::new()
    }
}

impl HeldAttaches {
    /// None held.
    pub(crate) fn new() -> HeldAttaches {
        HeldAttaches {
            entries: Mutex::default(),
            opens: Arc::new(tokio::sync::Semaphore::new(OPENS_AT_ONCE)),
        }
    }

    /// The slots of the attaches being opened ([`OPENS_AT_ONCE`]).
    pub(crate) fn opening_slots(&self) -> Arc<tokio::sync::Semaphore> {
        Arc::clone(&self.opens)
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<(String, String), Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attach held open to `namespace/pod`, taken (never given twice); None when none is
    /// held, or the one held has ended.
    pub(crate) fn take(&self, namespace: &str, pod: &str) -> Option<HeldAttach> {
        let key = (namespace.to_string(), pod.to_string());
        let mut entries = self.entries();
        if !matches!(entries.get(&key), Some(Entry::Open(_))) {
            return None;
        }
        match entries.remove(&key) {
            Some(Entry::Open(mut held)) => (!held.ended()).then_some(held),
            _ => None,
        }
    }

    /// How many attaches are held open now.
    pub(crate) fn held(&self) -> usize {
        let entries = self.entries();
        entries
            .values()
            .filter(|e| matches!(e, Entry::Open(_)))
            .count()
    }

    /// Whether an attach to `key` is held or being opened.
    pub(crate) fn has(&self, key: &(String, String)) -> bool {
        self.entries().contains_key(key)
    }

    /// Closes the attach held to `key`, if it is still the one of `uid` (any, when None).
    pub(crate) fn let_go(&self, key: &(String, String), uid: Option<&str>) {
        let mut entries = self.entries();
        let same = match (entries.get(key), uid) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(Entry::Opening { uid: held }), Some(uid)) => held == uid,
            (Some(Entry::Open(held)), Some(uid)) => held.uid == uid,
        };
        if same {
            entries.remove(key);
        }
    }

    /// Marks `key` as being opened for `uid`; false when it is held or being opened already,
    /// or [`HELD_AT_MOST`] are.
    pub(crate) fn begin(&self, key: &(String, String), uid: &str) -> bool {
        let mut entries = self.entries();
        if let Some(Entry::Open(held)) = entries.get_mut(key) {
            if held.uid == uid && !held.ended() {
                return false;
            }
            entries.remove(key);
        }
        if entries.contains_key(key) || entries.len() >= HELD_AT_MOST {
            return false;
        }
        entries.insert(
            key.clone(),
            Entry::Opening {
                uid: uid.to_string(),
            },
        );
        true
    }

    /// Keeps `held` for `key` if it is still being opened for the same pod (not let go
    /// meanwhile).
    pub(crate) fn opened(&self, key: (String, String), held: HeldAttach) {
        let mut entries = self.entries();
        if matches!(entries.get(&key), Some(Entry::Opening { uid }) if *uid == held.uid) {
            entries.insert(key, Entry::Open(held));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held attach to a pod of `uid` whose stream ended (`ended`) or still runs.
    fn held(uid: &str, ended: bool) -> HeldAttach {
        let (_, stdin) = tokio::io::simplex(64);
        let status: Ending = if ended {
            Box::pin(std::future::ready(None))
        } else {
            Box::pin(std::future::pending())
        };
        HeldAttach {
            uid: uid.to_string(),
            stdin,
            status,
            process: None,
        }
    }

    fn at(pod: &str) -> (String, String) {
        ("ns".to_string(), pod.to_string())
    }

    #[tokio::test]
    async fn a_held_attach_is_taken_once_and_never_one_that_ended() {
        let attaches = HeldAttaches::new();
        assert!(attaches.take("ns", "a").is_none(), "nothing held");
        assert!(attaches.begin(&at("a"), "u-a"));
        assert!(!attaches.begin(&at("a"), "u-a"), "being opened already");
        assert!(attaches.take("ns", "a").is_none(), "not open yet");
        attaches.opened(at("a"), held("u-a", false));
        assert_eq!(attaches.held(), 1);
        assert!(!attaches.begin(&at("a"), "u-a"), "held already");
        assert!(attaches.take("other", "a").is_none(), "another namespace's");
        assert!(attaches.take("ns", "a").is_some());
        assert!(attaches.take("ns", "a").is_none(), "never given twice");
        // One whose stream ended is dropped, not given; the pod may be held again.
        assert!(attaches.begin(&at("b"), "u-b"));
        attaches.opened(at("b"), held("u-b", true));
        assert!(attaches.take("ns", "b").is_none());
        assert!(attaches.begin(&at("b"), "u-b"));
        // Let go while being opened: the attach opened then is not kept; nor one of another
        // pod of the same name.
        attaches.let_go(&at("b"), Some("u-b"));
        attaches.opened(at("b"), held("u-b", false));
        assert_eq!(attaches.held(), 0);
        assert!(attaches.begin(&at("c"), "u-c"));
        attaches.opened(at("c"), held("u-other", false));
        assert_eq!(attaches.held(), 0);
        // A claimed pod's attach let go later only if it is still that pod's.
        assert!(attaches.begin(&at("d"), "u-d"));
        attaches.opened(at("d"), held("u-d", false));
        attaches.let_go(&at("d"), Some("u-old"));
        assert_eq!(attaches.held(), 1);
        attaches.let_go(&at("d"), Some("u-d"));
        assert_eq!(attaches.held(), 0);
    }
}
