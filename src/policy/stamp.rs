//! What admission verified, recorded where only the operator can vouch for it (docs/contract.md
//! "A run uses only its author's rights"; issue #38). The operator creates a run's pod with its
//! own ServiceAccount, so a Secret, ConfigMap, PVC, ServiceAccount or store the run names is used
//! with the operator's rights unless its author's were checked. Only the webhook sees who the
//! author is; without it (disabled, `failurePolicy: Ignore` after a timeout, a namespace it does
//! not cover) nothing was checked. So the webhook's mutating half writes, on the run it admitted
//! with every right verified, the annotation [`STAMP_ANNOTATION`]: an HMAC under a key only the
//! operator holds, over the run's namespace, its name (or `generateName`), the digest of its
//! whole spec and the time it was issued. The controller gives a pod to a run that exercises a
//! right only when the stamp verifies for that exact spec and was issued no earlier than the
//! run's creation (less [`SKEW_SECONDS`]): a client cannot forge one, a stamp copied from another run
//! names another run or spec, and one kept from a deleted run of the same name is older than
//! the new run. Pure: the key is an argument.
//!
//! A stamp also binds the request that wrote the spec (issue #51 item 3): a CREATE's stamp
//! vouches only for the run's first generation and only when it was issued at its creation
//! (within [`SKEW_SECONDS`] either side), an UPDATE's only for the stored run it updated (its
//! uid) at the generation that update gives it. So a stamp obtained for a run that already
//! exists — a forged review for a run held `RightsUnverified`, then written on it by a
//! metadata-only update — is refused: a CREATE stamp comes too late, and an UPDATE stamp names
//! a generation the run only reaches through a spec change, which the webhook judges again.

use ring::hmac;
use sha2::{Digest, Sha256};

use crate::api::SandboxRunSpec;

/// The annotation the webhook writes on a run whose author's rights it verified.
pub(crate) const STAMP_ANNOTATION: &str = "sandbox.iterion.io/admitted-rights";

/// How far the webhook's clock and the apiserver's may disagree: a stamp issued up to this long
/// before the run's creation (the mutating webhook sees a CREATE before the apiserver stamps
/// `creationTimestamp`) still counts.
pub(crate) const SKEW_SECONDS: i64 = 120;

/// The version prefix of a stamp's value.
const VERSION: &str = "v2";
/// The version of the stamps an older operator wrote (namespace, name, spec and time, no
/// request): still read, as a CREATE's stamp.
const VERSION_1: &str = "v1";

/// The key stamps are made and checked with (32 random bytes in a Secret of the operator's
/// namespace, shared by its replicas).
#[derive(Clone)]
pub struct StampKey(hmac::Key);

impl std::fmt::Debug for StampKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StampKey(..)")
    }
}

impl StampKey {
    /// The key of these bytes.
    pub fn new(bytes: &[u8]) -> StampKey {
        StampKey(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// The HMAC of `message` under this key (another record only the operator can vouch for:
    /// a warm pool pod's seal, `crate::pool::seal`).
    pub(crate) fn sign(&self, message: &[u8]) -> Vec<u8> {
        hmac::sign(&self.0, message).as_ref().to_vec()
    }

    /// Whether `tag` is the HMAC of `message` under this key (compared in constant time).
    pub(crate) fn verifies(&self, message: &[u8], tag: &[u8]) -> bool {
        hmac::verify(&self.0, message, tag).is_ok()
    }
}

/// What a stamp is bound to: the run's namespace and name (or, for a run created with
/// `generateName` and judged before the apiserver named it, that prefix), and its spec.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Subject<'a> {
    /// The run's namespace.
    pub namespace: &'a str,
    /// The run's name, or `generateName:<prefix>`.
    pub name: &'a str,
    /// The run's own spec (not a template's merge).
    pub spec: &'a SandboxRunSpec,
}

/// The request a stamp was issued in: what, besides the run and its spec, it binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Binding<'a> {
    /// The run's CREATE: its first generation, at its creation.
    Create,
    /// An UPDATE of the stored run `uid` that gives its spec generation `generation`.
    Update {
        /// The stored run's uid.
        uid: &'a str,
        /// The generation the update makes (the stored one + 1).
        generation: i64,
    },
}

impl Binding<'_> {
    /// How the binding is written in the stamp's value (the uid is not: the run carries it).
    fn token(&self) -> String {
        match self {
            Binding::Create => "c".to_string(),
            Binding::Update { generation, .. } => format!("u{generation}"),
        }
    }
}

/// The bytes the HMAC covers. `binding` None: an older operator's `v1` stamp.
fn message(subject: &Subject<'_>, binding: Option<Binding<'_>>, issued: i64) -> Vec<u8> {
    let spec = serde_json::to_vec(subject.spec).unwrap_or_default();
    let digest = Sha256::digest(&spec);
    let (version, request) = match binding {
        None => (VERSION_1, String::new()),
        Some(Binding::Create) => (VERSION, "create\n".to_string()),
        Some(Binding::Update { uid, generation }) => {
            (VERSION, format!("update\n{uid}\n{generation}\n"))
        }
    };
    let mut out = format!(
        "{version}\n{}\n{}\n{issued}\n{request}",
        subject.namespace, subject.name
    )
    .into_bytes();
    out.extend_from_slice(&digest);
    out
}

/// The stamp of `subject`, issued at `issued` (Unix seconds) in the request `binding`:
/// `v2.<issued>.<c|u<generation>>.<hex HMAC>`.
pub(crate) fn issue(
    key: &StampKey,
    subject: &Subject<'_>,
    binding: Binding<'_>,
    issued: i64,
) -> String {
    let tag = hmac::sign(&key.0, &message(subject, Some(binding), issued));
    format!(
        "{VERSION}.{issued}.{}.{}",
        binding.token(),
        hex::encode(tag.as_ref())
    )
}

/// What the controller knows of the run a stamp is checked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunFacts<'a> {
    /// `metadata.creationTimestamp` (Unix seconds).
    pub created: i64,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `metadata.generation` (the apiserver sets it: 1 at creation, + 1 per spec change).
    pub generation: i64,
}

/// Why a run's stamp does not vouch for it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unverified {
    /// No stamp: the webhook did not admit this run (or did not verify every right it uses).
    #[error("no admission stamp ({STAMP_ANNOTATION}): the operator's webhook did not verify its author's rights")]
    Missing,
    /// Not a stamp's shape.
    #[error("the {STAMP_ANNOTATION} annotation is not a stamp the operator wrote")]
    Malformed,
    /// The HMAC does not match: forged, copied from another run, or the spec changed since.
    #[error("the {STAMP_ANNOTATION} stamp does not match this run's namespace, name and spec (the spec changed after admission, or the stamp was not written for this run)")]
    Mismatch,
    /// Issued before the run existed: kept from an earlier run of the same name.
    #[error("the {STAMP_ANNOTATION} stamp was issued before this run was created")]
    Stale,
    /// A CREATE's stamp issued well after the run was created: not in its creation's request.
    #[error("the {STAMP_ANNOTATION} stamp was issued after this run was created, not by the request that created it")]
    Late,
    /// Issued for another generation of the spec than the run's: not by the request that wrote
    /// this spec.
    #[error("the {STAMP_ANNOTATION} stamp was issued for another generation of this run's spec, not by the request that wrote it")]
    Generation,
}

/// A stamp's value, read: when it was issued, the request it names (None: `v1`), its tag.
fn parse(value: &str) -> Result<(i64, Option<BindingToken>, Vec<u8>), Unverified> {
    let parts: Vec<&str> = value.split('.').collect();
    let (issued, binding, tag) = match parts[..] {
        [VERSION_1, issued, tag] => (issued, None, tag),
        [VERSION, issued, binding, tag] => {
            let binding = match binding.strip_prefix('u') {
                None if binding == "c" => BindingToken::Create,
                Some(generation) => {
                    BindingToken::Update(generation.parse().map_err(|_| Unverified::Malformed)?)
                }
                None => return Err(Unverified::Malformed),
            };
            (issued, Some(binding), tag)
        }
        _ => return Err(Unverified::Malformed),
    };
    let issued: i64 = issued.parse().map_err(|_| Unverified::Malformed)?;
    let tag = hex::decode(tag).map_err(|_| Unverified::Malformed)?;
    Ok((issued, binding, tag))
}

/// The request a stamp's value names.
#[derive(Clone, Copy, Debug)]
enum BindingToken {
    Create,
    Update(i64),
}

/// Checks `value` (the run's [`STAMP_ANNOTATION`]) for `subject`, the run `run`.
/// `generate_name`: the run's `metadata.generateName`, whose stamp may name that prefix instead
/// of the name. A CREATE's stamp (and an older operator's `v1` one) vouches for generation 1
/// only, issued within [`SKEW_SECONDS`] of the creation; an UPDATE's for the generation it names
/// of the run whose uid it names, issued no earlier than the creation.
pub(crate) fn verify(
    key: &StampKey,
    value: Option<&str>,
    subject: &Subject<'_>,
    generate_name: Option<&str>,
    run: RunFacts<'_>,
) -> Result<(), Unverified> {
    let (issued, token, tag) = parse(value.ok_or(Unverified::Missing)?)?;
    let binding = token.map(|t| match t {
        BindingToken::Create => Binding::Create,
        BindingToken::Update(generation) => Binding::Update {
            uid: run.uid,
            generation,
        },
    });
    let prefixed = generate_name.map(|g| format!("generateName:{g}"));
    let names = std::iter::once(subject.name).chain(prefixed.as_deref());
    let matches = names.into_iter().any(|name| {
        let bound = Subject { name, ..*subject };
        hmac::verify(&key.0, &message(&bound, binding, issued), &tag).is_ok()
    });
    if !matches {
        return Err(Unverified::Mismatch);
    }
    if issued < run.created.saturating_sub(SKEW_SECONDS) {
        return Err(Unverified::Stale);
    }
    match binding {
        Some(Binding::Update { generation, .. }) if generation != run.generation => {
            Err(Unverified::Generation)
        }
        Some(Binding::Update { .. }) => Ok(()),
        None | Some(Binding::Create) if run.generation != 1 => Err(Unverified::Generation),
        None | Some(Binding::Create) if issued > run.created.saturating_add(SKEW_SECONDS) => {
            Err(Unverified::Late)
        }
        None | Some(Binding::Create) => Ok(()),
    }
}

/// The name a stamp binds for a request: the run's name, or `generateName:<prefix>` when the
/// apiserver has not named it yet.
pub(crate) fn bound_name(name: &str, generate_name: Option<&str>) -> String {
    match generate_name {
        Some(prefix) if name.is_empty() => format!("generateName:{prefix}"),
        _ => name.to_string(),
    }
}

/// What the controller does with a run that exercises a right no admission verified
/// (`run --unadmitted-references`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnadmittedReferences {
    /// No pod: the run waits, `Ready=False RightsUnverified` (the default).
    #[default]
    Hold,
    /// A pod all the same, with the operator's rights: only where every SandboxRun author may
    /// use every Secret, ConfigMap, PVC and ServiceAccount of the namespace.
    Trust,
}

/// The controller's side of the stamps: what it does without one, and the key it checks them
/// with (None: the key could not be read; every run that needs a stamp is then held).
#[derive(Clone, Debug, Default)]
pub(crate) struct RightsPolicy {
    /// Without a valid stamp.
    pub unadmitted: UnadmittedReferences,
    /// The key.
    pub key: Option<StampKey>,
}

/// Why `run` may not have a pod yet (docs/contract.md "A run uses only its author's rights"):
/// it exercises rights ([`super::access::required`]) and no stamp vouches that admission
/// verified them for its spec. None: it may (no right used, a valid stamp, or `trust`).
pub(crate) fn unverified_rights(
    run: &crate::api::SandboxRun,
    policy: &RightsPolicy,
) -> Option<String> {
    if policy.unadmitted == UnadmittedReferences::Trust {
        return None;
    }
    let fields = super::access::required_fields(&run.spec);
    if fields.is_empty() {
        return None;
    }
    let why = match &policy.key {
        None => "the operator could not read its admission key".to_string(),
        Some(key) => {
            let meta = &run.metadata;
            let subject = Subject {
                namespace: meta.namespace.as_deref().unwrap_or_default(),
                name: meta.name.as_deref().unwrap_or_default(),
                spec: &run.spec,
            };
            let facts = RunFacts {
                created: meta
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |t| t.0.as_second()),
                uid: meta.uid.as_deref().unwrap_or_default(),
                // The apiserver always sets it; a run without one is treated as just created.
                generation: meta.generation.unwrap_or(1),
            };
            let value = meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(STAMP_ANNOTATION));
            let generate_name = meta.generate_name.as_deref();
            verify(
                key,
                value.map(String::as_str),
                &subject,
                generate_name,
                facts,
            )
            .err()?
            .to_string()
        }
    };
    Some(format!(
        "the run uses what its author's rights must cover ({}) and no admission verified them: {why}; \
         the pod is not created. Create or update the run while the operator's webhook serves it \
         (enabled, failurePolicy Fail, its namespaceSelector covering this namespace), or drop \
         those fields; a platform whose every author may use everything in the namespace runs \
         the operator with --unadmitted-references=trust",
        fields.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Mount, MountType};

    fn spec(command: &str) -> SandboxRunSpec {
        SandboxRunSpec {
            image: Some("img@sha256:abc".into()),
            command: Some(vec!["sh".into(), "-c".into(), command.into()]),
            mounts: vec![Mount {
                name: "db".into(),
                kind: MountType::Secret,
                source: Some("db-credentials".into()),
                target: "/secret".into(),
                read_only: true,
            }],
            ..Default::default()
        }
    }

    /// docs/contract.md "Pause, resume and fork": with the webhook out of the way, a fork is held
    /// like a run naming a Secret: no stamp, no pod.
    #[test]
    fn a_fork_without_a_stamp_is_held_unverified() {
        let mut run = crate::api::SandboxRun::new(
            "b",
            SandboxRunSpec {
                image: Some("img@sha256:abc".into()),
                command: Some(vec!["true".into()]),
                workspace: Some(crate::api::Workspace {
                    from: Some(crate::api::WorkspaceFrom {
                        run: "a".into(),
                        attempt: None,
                        checkpoint: None,
                    }),
                    ..crate::api::Workspace::default()
                }),
                ..Default::default()
            },
        );
        run.metadata.namespace = Some("team".into());
        let policy = RightsPolicy {
            unadmitted: UnadmittedReferences::Hold,
            key: Some(StampKey::new(b"0123456789abcdef0123456789abcdef")),
        };
        let why = unverified_rights(&run, &policy).expect("held");
        assert!(why.contains("spec.workspace.from.run"), "{why}");
        run.spec.workspace = None;
        assert_eq!(unverified_rights(&run, &policy), None);
    }

    /// Issue #38: with the webhook out of the way, a run naming a Secret got a pod with the
    /// operator's rights. Only a stamp the operator's key made for this very run and spec, no
    /// older than the run, vouches that its author's rights were checked.
    #[test]
    fn a_stamp_vouches_only_for_the_run_and_spec_it_was_issued_for_after_its_creation() {
        let key = StampKey::new(b"0123456789abcdef0123456789abcdef");
        let admitted = spec("make report");
        let subject = Subject {
            namespace: "team-a",
            name: "report",
            spec: &admitted,
        };
        let created = 1_800_000_000;
        let stamp = issue(&key, &subject, Binding::Create, created - 1);
        let check = |value: Option<&str>, subject: &Subject<'_>, created: i64| {
            let run = RunFacts {
                created,
                uid: "u-1",
                generation: 1,
            };
            verify(&key, value, subject, None, run)
        };
        assert_eq!(check(Some(&stamp), &subject, created), Ok(()));
        assert_eq!(check(None, &subject, created), Err(Unverified::Missing));
        assert_eq!(
            check(Some("v1.12.zz"), &subject, created),
            Err(Unverified::Malformed)
        );
        // Another key (a forger's), another run, another namespace, another command.
        let forged = issue(&StampKey::new(b"guess"), &subject, Binding::Create, created);
        assert_eq!(
            check(Some(&forged), &subject, created),
            Err(Unverified::Mismatch)
        );
        let other = Subject {
            name: "other",
            ..subject
        };
        assert_eq!(
            check(Some(&stamp), &other, created),
            Err(Unverified::Mismatch)
        );
        let elsewhere = Subject {
            namespace: "team-b",
            ..subject
        };
        assert_eq!(
            check(Some(&stamp), &elsewhere, created),
            Err(Unverified::Mismatch)
        );
        let hijacked = spec("cat /secret/*");
        let changed = Subject {
            spec: &hijacked,
            ..subject
        };
        assert_eq!(
            check(Some(&stamp), &changed, created),
            Err(Unverified::Mismatch)
        );
        // A stamp kept from a deleted run of the same name: issued before this run existed.
        let later = created + SKEW_SECONDS + 60;
        assert_eq!(check(Some(&stamp), &subject, later), Err(Unverified::Stale));
    }

    #[test]
    fn a_run_named_by_the_apiserver_is_bound_by_its_generate_name() {
        let key = StampKey::new(b"k");
        let admitted = spec("true");
        let at_admission = bound_name("", Some("job-"));
        assert_eq!(at_admission, "generateName:job-");
        let stamp = issue(
            &key,
            &Subject {
                namespace: "ns",
                name: &at_admission,
                spec: &admitted,
            },
            Binding::Create,
            100,
        );
        let run = RunFacts {
            created: 100,
            uid: "u-1",
            generation: 1,
        };
        let named = Subject {
            namespace: "ns",
            name: "job-x7k2p",
            spec: &admitted,
        };
        assert_eq!(
            verify(&key, Some(&stamp), &named, Some("job-"), run),
            Ok(())
        );
        assert_eq!(
            verify(&key, Some(&stamp), &named, Some("other-"), run),
            Err(Unverified::Mismatch)
        );
        assert_eq!(bound_name("named", Some("job-")), "named");
    }

    /// Issue #51 item 3: anyone who reached the webhook could POST a review for a run already
    /// held `RightsUnverified` and write the stamp it got on the run by a metadata-only update.
    /// A CREATE's stamp obtained after the run was created, and an UPDATE's stamp for the
    /// generation the run already has (or for another run's uid), vouch for nothing; the stamp
    /// of the request that really wrote the spec still does.
    #[test]
    fn a_stamp_obtained_for_a_run_that_already_exists_vouches_for_nothing() {
        let key = StampKey::new(b"0123456789abcdef0123456789abcdef");
        let admitted = spec("cat /secret/*");
        let subject = Subject {
            namespace: "team-a",
            name: "held",
            spec: &admitted,
        };
        let created = 1_800_000_000;
        let held = RunFacts {
            created,
            uid: "u-held",
            generation: 1,
        };
        let check = |stamp: &str, run: RunFacts<'_>| verify(&key, Some(stamp), &subject, None, run);
        // Stamped by its CREATE: vouches.
        let at_creation = issue(&key, &subject, Binding::Create, created - 1);
        assert_eq!(check(&at_creation, held), Ok(()));
        // A forged CREATE review an hour after the run was created.
        let forged_create = issue(&key, &subject, Binding::Create, created + 3_600);
        assert_eq!(check(&forged_create, held), Err(Unverified::Late));
        // A CREATE's stamp never vouches for a later generation of the spec.
        let updated = RunFacts {
            generation: 2,
            ..held
        };
        assert_eq!(check(&at_creation, updated), Err(Unverified::Generation));
        // A forged UPDATE review claiming the run's current generation as the one it makes.
        let forged_update = issue(
            &key,
            &subject,
            Binding::Update {
                uid: "u-held",
                generation: 1,
            },
            created + 3_600,
        );
        assert_eq!(check(&forged_update, updated), Err(Unverified::Generation));
        // The stamp of the real UPDATE that made generation 2 of this run vouches for it, not
        // for a run of the same name with another uid.
        let real_update = issue(
            &key,
            &subject,
            Binding::Update {
                uid: "u-held",
                generation: 2,
            },
            created + 60,
        );
        assert_eq!(check(&real_update, updated), Ok(()));
        let recreated = RunFacts {
            uid: "u-other",
            ..updated
        };
        assert_eq!(check(&real_update, recreated), Err(Unverified::Mismatch));
    }
}
