//! The watches of a sharded replica (docs/contract.md "Shards"): its runs and pods are watched
//! with the label selector `sandbox.iterion.io/shard in (<its shards>)`, restarted whenever the
//! set of shards it owns changes, so its cache holds its share of the runs, not all of them. A
//! restart is a fresh list (the reflector replaces its store on the list's end), and an empty
//! set is an empty list.

use std::collections::BTreeSet;
use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::StreamExt;
use kube::runtime::watcher::{self, watcher, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::SHARD_LABEL;

/// The label selector of `owned` on top of `base` (None: no shard owned, nothing to watch).
pub(crate) fn selector(base: Option<&str>, owned: &BTreeSet<u32>) -> Option<String> {
    if owned.is_empty() {
        return None;
    }
    let shards: Vec<String> = owned.iter().map(u32::to_string).collect();
    let mine = format!("{SHARD_LABEL} in ({})", shards.join(","));
    Some(match base.filter(|b| !b.is_empty()) {
        Some(base) => format!("{base},{mine}"),
        None => mine,
    })
}

/// The watch events of `api`'s objects in the shards `owned` says, under `base`'s selector:
/// the watch restarts (a fresh list) on every change of the set.
pub(crate) fn owned_watch<K>(
    api: Api<K>,
    base: watcher::Config,
    owned: watch::Receiver<BTreeSet<u32>>,
) -> BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    type Current<K> = BoxStream<'static, Result<Event<K>, watcher::Error>>;
    let state: (watch::Receiver<BTreeSet<u32>>, Option<Current<K>>) = (owned, None);
    futures::stream::unfold(state, move |(mut owned, current)| {
        let api = api.clone();
        let base = base.clone();
        async move {
            let mut current = match current {
                Some(current) => current,
                None => {
                    let set = owned.borrow_and_update().clone();
                    for_set(api, base, &set)
                }
            };
            tokio::select! {
                changed = owned.changed() => {
                    changed.ok()?;
                    // Dropped: the next poll starts the watch of the new set.
                    drop(current);
                    Some((Ok(Event::Init), (owned, None)))
                }
                item = current.next() => {
                    let item = item?;
                    Some((item, (owned, Some(current))))
                }
            }
        }
    })
    .boxed()
}

/// One watch of the set `set` (an empty list then nothing, for no shard).
fn for_set<K>(
    api: Api<K>,
    base: watcher::Config,
    set: &BTreeSet<u32>,
) -> BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    match selector(base.label_selector.as_deref(), set) {
        Some(labels) => watcher(api, base.labels(&labels)).boxed(),
        None => futures::stream::iter([Ok(Event::Init), Ok(Event::InitDone)])
            .chain(futures::stream::pending())
            .boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_names_exactly_the_owned_shards_under_the_base() {
        assert_eq!(selector(None, &BTreeSet::new()), None);
        assert_eq!(
            selector(None, &BTreeSet::from([3, 1, 20])).as_deref(),
            Some("sandbox.iterion.io/shard in (1,3,20)")
        );
        assert_eq!(
            selector(Some("a=b"), &BTreeSet::from([0])).as_deref(),
            Some("a=b,sandbox.iterion.io/shard in (0)")
        );
        assert_eq!(
            selector(Some(""), &BTreeSet::from([0])).as_deref(),
            Some("sandbox.iterion.io/shard in (0)")
        );
    }
}
