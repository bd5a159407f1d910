//! One stored object's URL, as a run's status names it (`status.readBack[].object` and
//! `.manifest`; docs/contract.md §3): rendered from the store's URL and the object's key
//! ([`ObjectUrl::of`]), and read back ([`ObjectUrl::parse`]) into the store and the run instance
//! whose directory holds it (the key layout of `store::keys`: `<store>/<namespace>/<name>/<uid>/`
//! then the file, or a generation's directory — `attempt-N/`, `checkpoint-N/` — and its file).
//! One type both ways, so what the operator writes is what its readers take apart.

use std::fmt;

use object_store::path::Path;

/// The URL of one object of a store: for a file:// store the store URL's directory and the key;
/// elsewhere the scheme, the bucket and the key (the key already carries the URL's prefix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectUrl(String);

/// What an object URL says of the run whose object it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunObject {
    /// The store URL as far as the object URL keeps it: scheme, bucket and prefix.
    pub store_url: String,
    /// The uid of the run instance whose directory holds the object.
    pub uid: String,
}

impl ObjectUrl {
    /// The URL of `key` in the store at `store_url` (a URL that does not parse: the key alone).
    pub fn of(store_url: &str, key: &Path) -> ObjectUrl {
        ObjectUrl(match url::Url::parse(store_url) {
            Ok(u) if u.scheme() == "file" => format!("{}/{key}", store_url.trim_end_matches('/')),
            Ok(u) => format!("{}://{}/{key}", u.scheme(), u.host_str().unwrap_or("")),
            Err(_) => key.to_string(),
        })
    }

    /// The URL as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The URL as text, owned.
    pub fn into_string(self) -> String {
        self.0
    }

    /// Whether `object` (a URL a status records) names an object below this one, taken as a
    /// directory (the run directory of [`crate::store::run_dir`], rendered by [`ObjectUrl::of`]).
    pub fn holds(&self, object: &str) -> bool {
        object
            .strip_prefix(self.0.as_str())
            .is_some_and(|rest| rest.starts_with('/'))
    }

    /// The store and run instance of `object`, an object URL of the run `namespace/name`: the
    /// URL is `<store>/<namespace>/<name>/<uid>/<file>`, or `…/<uid>/<generation>/<file>` for a
    /// later attempt's or a checkpoint's object (`attempt-N`, `checkpoint-N`). None: another
    /// run's object, or not of the layout (no scheme, no bucket, an empty segment).
    pub fn parse(object: &str, namespace: &str, name: &str) -> Option<RunObject> {
        let generation = object.rsplit('/').nth(1).is_some_and(is_generation);
        let mut parts = object.rsplitn(if generation { 6 } else { 5 }, '/');
        let file = parts.next()?;
        if generation {
            parts.next()?;
        }
        let (uid, n, ns, store) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let store_ok = store
            .split_once("://")
            .is_some_and(|(scheme, rest)| !scheme.is_empty() && !rest.trim_matches('/').is_empty());
        let named = n == name && ns == namespace && !uid.is_empty() && !file.is_empty();
        (named && store_ok).then(|| RunObject {
            store_url: store.to_string(),
            uid: uid.to_string(),
        })
    }
}

/// Whether a key segment is a generation's directory (`store::keys`: `attempt-N`, `checkpoint-N`).
fn is_generation(segment: &str) -> bool {
    ["attempt-", "checkpoint-"].iter().any(|head| {
        segment
            .strip_prefix(head)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_url_keeps_scheme_and_bucket_or_a_file_stores_directory() {
        let key = Path::from("runs/ns/a/u/00-out.tar");
        assert_eq!(
            ObjectUrl::of("s3://bucket/runs", &key).as_str(),
            "s3://bucket/runs/ns/a/u/00-out.tar"
        );
        assert_eq!(
            ObjectUrl::of("file:///var/lib/store", &key).to_string(),
            "file:///var/lib/store/runs/ns/a/u/00-out.tar"
        );
        assert_eq!(
            ObjectUrl::of("not a url", &key).as_str(),
            "runs/ns/a/u/00-out.tar"
        );
    }

    #[test]
    fn what_is_rendered_parses_back_to_its_store_and_run_every_generation_included() {
        let store = "s3://bucket/runs";
        let keys = [
            "runs/ns/job/u-1/00-out.tar",
            "runs/ns/job/u-1/attempt-2/00-out.tar",
            "runs/ns/job/u-1/checkpoint-3/01-x.manifest.json",
        ];
        for key in keys {
            let url = ObjectUrl::of(store, &Path::from(key));
            assert_eq!(
                ObjectUrl::parse(url.as_str(), "ns", "job"),
                Some(RunObject {
                    store_url: "s3://bucket/runs".into(),
                    uid: "u-1".into()
                }),
                "{url}"
            );
        }
        // A run directory holds its objects, not another run's nor one beside it.
        let dir = ObjectUrl::of(store, &Path::from("runs/ns/job/u-1"));
        assert!(dir.holds("s3://bucket/runs/ns/job/u-1/attempt-2/00-out.tar"));
        assert!(!dir.holds("s3://bucket/runs/ns/job/u-10/00-out.tar"));
        assert!(!dir.holds("s3://other/runs/ns/job/u-1/00-out.tar"));
    }

    #[test]
    fn another_runs_object_or_one_off_the_layout_does_not_parse() {
        let at = |o: &str| ObjectUrl::parse(o, "ns", "job");
        assert_eq!(at("s3://bucket/ns/other/u/00-out.tar"), None);
        assert_eq!(at("s3://bucket/other/job/u/00-out.tar"), None);
        assert_eq!(at("ns/job/u/00-out.tar"), None);
        assert_eq!(at("bucket/ns/job/u/00-out.tar"), None);
        assert_eq!(at("s3:///ns/job/u/00-out.tar"), None);
        assert_eq!(at("s3://bucket/ns/job//00-out.tar"), None);
        assert_eq!(at("s3://bucket/ns/job/u/"), None);
        // A generation's directory is never taken for the uid.
        assert_eq!(at("s3://bucket/ns/job/attempt-2/00-out.tar"), None);
    }
}
