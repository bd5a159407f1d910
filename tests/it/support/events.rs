//! Events the operator records (events.k8s.io/v1), as tests look for them.

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::{Api, Client};

use super::operator::Operator;
use super::wait::eventually_or_log;

/// Every Event in `ns` (empty when they cannot be listed).
async fn all_events(client: &Client, ns: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    events
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// The Events in `ns` with `reason`, about any object.
pub async fn events_with_reason(client: &Client, ns: &str, reason: &str) -> Vec<Event> {
    all_events(client, ns)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// The Events in `ns` with `reason` about the object named `name`.
pub async fn events_of(client: &Client, ns: &str, name: &str, reason: &str) -> Vec<Event> {
    events_about(client, ns, name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Every Event in `ns` about the object named `name`, oldest first.
pub async fn events_about(client: &Client, ns: &str, name: &str) -> Vec<Event> {
    let mut about: Vec<Event> = all_events(client, ns)
        .await
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    about.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .cmp(&b.metadata.creation_timestamp)
    });
    about
}

/// Waits (up to `timeout`) for an Event in `ns` with `reason`, about any object (`about: None`)
/// or about the object named `about`; returns the first one listed. The failure message carries
/// the operator's log tail.
pub async fn wait_event(
    client: &Client,
    ns: &str,
    about: Option<&str>,
    reason: &str,
    timeout: Duration,
    op: &Operator,
) -> Event {
    let what = match about {
        Some(name) => format!("a {reason} Event about {name}"),
        None => format!("a {reason} Event"),
    };
    eventually_or_log(&what, timeout, op, || async {
        match about {
            Some(name) => events_of(client, ns, name, reason).await,
            None => events_with_reason(client, ns, reason).await,
        }
        .into_iter()
        .next()
    })
    .await
}
