//! Fork (docs/contract.md "Pause, resume and fork"): a run whose `spec.workspace.from` names
//! another run of its namespace starts with that run's saved files. Which run, which uid and which
//! attempt the fork is bound to ([`fork_source`], [`bind`]). Pure: the act stage reads the source
//! run once, when its first restore is carried out, and [`bind`] judges what it read.
//!
//! The source is bound by its uid: the first restore from it records its name, uid and attempt in
//! `status.restores[]`, and every later restore from it takes them from there (never from the
//! spec again, never another uid: a source deleted or re-created under its name is never read).

use crate::api::{Phase, ReadBackPhase, RestoreOutcome, SandboxRun};
use crate::identity::RunId;

/// Where the current attempt's files come from (`super::restore::restore_source`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Source {
    /// The run's own attempt.
    Own(u32),
    /// Another run's files (a fork, `spec.workspace.from`): read, bound and chosen when the
    /// restore is carried out ([`bind`]).
    Fork(ForkSource),
}

/// The run a fork's attempt restores from, as far as the fork knows before reading it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ForkSource {
    /// Its name, in the fork's namespace.
    pub run: String,
    /// The attempt asked or recorded; None: the source's newest whose workload ran (or its
    /// checkpoint, when `checkpoint` is set).
    pub attempt: Option<u32>,
    /// The checkpoint asked or recorded (`spec.workspace.from.checkpoint`); None: an attempt.
    pub checkpoint: Option<u32>,
    /// The uid recorded by the first restore from it; None: never read yet.
    pub uid: Option<String>,
}

/// What a restore was bound to once its source was known.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Bound {
    /// The source run's name; None: the run's own files.
    pub run: Option<String>,
    /// The source run's uid as read; None: the run's own, or never read.
    pub uid: Option<String>,
    /// The attempt whose files (0: none could be chosen); a checkpoint's: the attempt it was
    /// taken at.
    pub attempt: u32,
    /// The source's checkpoint whose files; None: the attempt's drained files.
    pub checkpoint: Option<u32>,
}

/// Which of a run's saved generations a restore reads (`crate::store` keys and the manifest's
/// identity, docs/contract.md "Pause, resume and fork").
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Generation {
    /// The drain of attempt N (`<uid>/attempt-N/`).
    Attempt(u32),
    /// Checkpoint N (`<uid>/checkpoint-N/`), taken at the attempt it records.
    Checkpoint { checkpoint: u32, attempt: u32 },
}

impl std::fmt::Display for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Generation::Attempt(attempt) => write!(f, "attempt {attempt}"),
            Generation::Checkpoint { checkpoint, .. } => write!(f, "checkpoint {checkpoint}"),
        }
    }
}

impl Generation {
    /// (the attempt, the checkpoint or None).
    pub(crate) fn parts(self) -> (u32, Option<u32>) {
        match self {
            Generation::Attempt(attempt) => (attempt, None),
            Generation::Checkpoint {
                checkpoint,
                attempt,
            } => (attempt, Some(checkpoint)),
        }
    }
}

/// Whether `manifest` is the one the restore expects (docs/contract.md "Pause, resume and
/// fork"): `whose` run's, generation `from`'s (its attempt, and its checkpoint or none), and the
/// `index`-th declared path's. One check for every restore; the expected identity is the
/// parameter.
pub(crate) fn manifest_is(
    manifest: &crate::store::Manifest,
    whose: &RunId,
    from: Generation,
    (index, path): (usize, &str),
) -> bool {
    let (attempt, checkpoint) = from.parts();
    manifest.run == *whose
        && manifest.run_attempt == attempt
        && manifest.checkpoint == checkpoint
        && manifest.index == index
        && manifest.declared_path == path
}

impl Bound {
    /// The generation whose keys and manifests are read.
    pub(crate) fn generation(&self) -> Generation {
        match self.checkpoint {
            Some(checkpoint) => Generation::Checkpoint {
                checkpoint,
                attempt: self.attempt,
            },
            None => Generation::Attempt(self.attempt),
        }
    }
}

impl Bound {
    /// The run's own attempt `attempt`.
    pub(crate) fn own(attempt: u32) -> Bound {
        Bound {
            attempt,
            ..Bound::default()
        }
    }
}

/// Where `run`'s current attempt restores from when it is a fork not yet past its source: it sets
/// `spec.workspace.from` and none of its earlier attempts was restored (its workload never ran on
/// other files). The identity the first restore recorded wins over the spec.
pub(crate) fn fork_source(run: &SandboxRun) -> Option<ForkSource> {
    let asked = run.spec.workspace.as_ref()?.from.as_ref()?;
    let current = crate::identity::current_attempt(run);
    let restores = run.status.as_ref().map(|s| s.restores.as_slice());
    let restores = restores.unwrap_or_default();
    let past_source = restores
        .iter()
        .any(|r| r.attempt < current && r.outcome == RestoreOutcome::Restored);
    if past_source {
        return None;
    }
    let recorded = restores
        .iter()
        .find_map(|r| Some((r.from_run.clone()?, r.from_uid.clone()?, r)));
    Some(match recorded {
        Some((run, uid, r)) => ForkSource {
            run,
            attempt: r.from_checkpoint.is_none().then_some(r.from_attempt),
            checkpoint: r.from_checkpoint,
            uid: Some(uid),
        },
        None => ForkSource {
            run: asked.run.clone(),
            attempt: asked.attempt,
            checkpoint: asked.checkpoint,
            uid: None,
        },
    })
}

/// Why a fork's source cannot be restored from.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum NotBound {
    #[error("the source run {0} does not exist in this namespace")]
    Missing(String),
    /// The source as read has no identity (not one the apiserver sent).
    #[error("the source run: {0}")]
    Unidentified(#[from] crate::identity::MissingIdentity),
    #[error(
        "the source run {run} is not the one this fork was bound to (uid {found}, recorded \
         {recorded}): it was deleted and re-created, and its files are never read"
    )]
    Recreated {
        run: String,
        found: String,
        recorded: String,
    },
    #[error(
        "the source run {run} stores its files in {source_store}, this run in {fork_store}: a fork \
         restores only from its own store"
    )]
    OtherStore {
        run: String,
        source_store: String,
        fork_store: String,
    },
    #[error("the source run {run} has no saved attempt {attempt} whose workload ran")]
    NoSuchAttempt { run: String, attempt: u32 },
    #[error("the source run {0} has no saved files yet (no ended attempt whose workload ran)")]
    NothingSaved(String),
    #[error(
        "spec.workspace.from names both attempt {attempt} and checkpoint {checkpoint} of run \
         {run}: a fork starts from one of them"
    )]
    AttemptAndCheckpoint {
        run: String,
        attempt: u32,
        checkpoint: u32,
    },
    #[error(
        "the source run {run} records no checkpoint {checkpoint} with every path saved (none, \
         refused, still being taken, or a path not drained whole)"
    )]
    NoSuchCheckpoint { run: String, checkpoint: u32 },
}

/// `fork`'s restore bound to `source` (as read now; None: not found) for `asked`: the run whose
/// manifests are read (its namespace, name and uid) and the generation, or why not.
pub(crate) fn bind(
    fork: &SandboxRun,
    source: Option<&SandboxRun>,
    asked: &ForkSource,
) -> Result<(RunId, Generation), NotBound> {
    let source = source.ok_or_else(|| NotBound::Missing(asked.run.clone()))?;
    // The source's own identity (read from the apiserver, it has one): its files' directory.
    let whose = RunId::of(source)?;
    if let Some(recorded) = asked.uid.as_ref().filter(|r| **r != whose.uid) {
        return Err(NotBound::Recreated {
            run: asked.run.clone(),
            found: whose.uid,
            recorded: recorded.clone(),
        });
    }
    let store_of = |spec: &crate::api::SandboxRunSpec| {
        spec.store_ref()
            .map_or("the default store".to_string(), |s| format!("store {s}"))
    };
    // The source's store as it was made (its template's merge, when it has one).
    let made = crate::template::recorded(source);
    let source_spec = made.as_ref().map_or(&source.spec, |m| &m.spec);
    let (source_store, fork_store) = (store_of(source_spec), store_of(&fork.spec));
    if source_store != fork_store {
        return Err(NotBound::OtherStore {
            run: asked.run.clone(),
            source_store,
            fork_store,
        });
    }
    let generation = saved_generation(source, asked)?;
    Ok((whose, generation))
}

/// The generation of `source` that `asked` names, when the source records it saved: exactly one
/// of an attempt and a checkpoint (the operator's own refusal, the webhook bypassed).
fn saved_generation(source: &SandboxRun, asked: &ForkSource) -> Result<Generation, NotBound> {
    let run = || asked.run.clone();
    match (asked.attempt, asked.checkpoint) {
        (Some(attempt), Some(checkpoint)) => Err(NotBound::AttemptAndCheckpoint {
            run: run(),
            attempt,
            checkpoint,
        }),
        (None, Some(checkpoint)) => saved_checkpoint(source, checkpoint)
            .map(|attempt| Generation::Checkpoint {
                checkpoint,
                attempt,
            })
            .ok_or_else(|| NotBound::NoSuchCheckpoint {
                run: run(),
                checkpoint,
            }),
        (Some(attempt), None) if saved_attempts(source).contains(&attempt) => {
            Ok(Generation::Attempt(attempt))
        }
        (Some(attempt), None) => Err(NotBound::NoSuchAttempt {
            run: run(),
            attempt,
        }),
        (None, None) => saved_attempts(source)
            .last()
            .map(|&a| Generation::Attempt(a))
            .ok_or_else(|| NotBound::NothingSaved(run())),
    }
}

/// The attempt `source`'s checkpoint `checkpoint` was taken at, when its status records it with
/// every declared path saved whole (`Drained` or `Empty`): never one refused, still being taken
/// (a path `Pending`), failed or capped.
fn saved_checkpoint(source: &SandboxRun, checkpoint: u32) -> Option<u32> {
    let status = source.status.as_ref()?;
    let recorded = status.checkpoints.iter().find(|c| c.index == checkpoint)?;
    let whole = |p: &crate::api::ReadBackStatus| {
        matches!(p.phase, ReadBackPhase::Drained | ReadBackPhase::Empty)
    };
    let saved = !recorded.is_refused()
        && !recorded.read_back.is_empty()
        && recorded.read_back.iter().all(whole);
    saved.then(|| recorded.attempt.unwrap_or(1))
}

/// `source`'s attempts whose workload ran and whose files were saved, oldest first: its ended
/// attempts, and its current one once it finished; never one whose own restore failed.
fn saved_attempts(source: &SandboxRun) -> Vec<u32> {
    let Some(status) = source.status.as_ref() else {
        return Vec::new();
    };
    let finished = matches!(
        status.phase,
        Some(Phase::Succeeded | Phase::Failed | Phase::Stopped)
    );
    let current = crate::identity::current_attempt(source);
    let ended = status.attempts.iter().map(|a| a.index);
    let failed = |attempt: u32| {
        status
            .restores
            .iter()
            .any(|r| r.attempt == attempt && r.outcome == RestoreOutcome::Failed)
    };
    ended
        .filter(|&a| a < current)
        .chain(finished.then_some(current))
        .filter(|&a| !failed(a))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        AttemptStatus, ReadBack, RestoreStatus, SandboxRunSpec, SandboxRunStatus, Workspace,
        WorkspaceFrom,
    };

    fn source(uid: &str, ended: u32, phase: Phase) -> SandboxRun {
        let mut run = SandboxRun::new("a", SandboxRunSpec::default());
        run.metadata.namespace = Some("ns".into());
        run.metadata.uid = Some(uid.into());
        run.status = Some(SandboxRunStatus {
            phase: Some(phase),
            attempts: (1..=ended)
                .map(|index| AttemptStatus {
                    index,
                    ..AttemptStatus::default()
                })
                .collect(),
            ..SandboxRunStatus::default()
        });
        run
    }

    fn fork(attempt: Option<u32>) -> SandboxRun {
        let mut run = SandboxRun::new(
            "b",
            SandboxRunSpec {
                workspace: Some(Workspace {
                    from: Some(WorkspaceFrom {
                        run: "a".into(),
                        attempt,
                        checkpoint: None,
                    }),
                    ..Workspace::default()
                }),
                ..SandboxRunSpec::default()
            },
        );
        run.metadata.namespace = Some("ns".into());
        run
    }

    fn asked(attempt: Option<u32>, uid: Option<&str>) -> ForkSource {
        ForkSource {
            run: "a".into(),
            attempt,
            checkpoint: None,
            uid: uid.map(Into::into),
        }
    }

    #[test]
    fn a_fork_restores_from_the_sources_newest_saved_attempt_or_the_one_it_names() {
        let b = fork(None);
        // Finished after two ended attempts: its third (current) attempt is its newest saved.
        let done = source("u1", 2, Phase::Succeeded);
        let (whose, attempt) = bind(&b, Some(&done), &asked(None, None)).unwrap();
        assert_eq!(
            (
                whose.namespace.as_str(),
                whose.name.as_str(),
                whose.uid.as_str(),
                attempt
            ),
            ("ns", "a", "u1", Generation::Attempt(3))
        );
        // Paused (not finished): its newest ended attempt.
        let paused = source("u1", 2, Phase::Pending);
        assert_eq!(
            bind(&b, Some(&paused), &asked(None, None)).unwrap().1,
            Generation::Attempt(2)
        );
        assert_eq!(
            bind(&b, Some(&paused), &asked(Some(1), None)).unwrap().1,
            Generation::Attempt(1)
        );
        // Its running attempt has no saved files yet; an attempt whose restore failed never ran.
        assert_eq!(
            bind(&b, Some(&paused), &asked(Some(3), None)),
            Err(NotBound::NoSuchAttempt {
                run: "a".into(),
                attempt: 3
            })
        );
        let mut failed = paused.clone();
        failed
            .status
            .as_mut()
            .unwrap()
            .restores
            .push(RestoreStatus {
                attempt: 2,
                outcome: RestoreOutcome::Failed,
                ..RestoreStatus::default()
            });
        assert_eq!(
            bind(&b, Some(&failed), &asked(None, None)).unwrap().1,
            Generation::Attempt(1)
        );
        let fresh = source("u1", 0, Phase::Running);
        assert_eq!(
            bind(&b, Some(&fresh), &asked(None, None)),
            Err(NotBound::NothingSaved("a".into()))
        );
    }

    #[test]
    fn a_source_re_created_under_its_name_or_gone_is_never_read() {
        let b = fork(None);
        let again = source("u2", 1, Phase::Succeeded);
        assert!(matches!(
            bind(&b, Some(&again), &asked(Some(1), Some("u1"))),
            Err(NotBound::Recreated { .. })
        ));
        assert_eq!(
            bind(&b, None, &asked(None, None)),
            Err(NotBound::Missing("a".into()))
        );
        assert!(bind(&b, Some(&again), &asked(Some(1), Some("u2"))).is_ok());
    }

    #[test]
    fn a_fork_restores_only_from_a_source_in_its_own_store() {
        let mut b = fork(None);
        let a = source("u1", 1, Phase::Succeeded);
        assert!(bind(&b, Some(&a), &asked(None, None)).is_ok());
        b.spec.read_back = Some(ReadBack {
            store_ref: Some("team-store".into()),
            ..ReadBack::default()
        });
        assert!(matches!(
            bind(&b, Some(&a), &asked(None, None)),
            Err(NotBound::OtherStore { .. })
        ));
    }

    #[test]
    fn a_forks_first_restore_binds_it_and_later_attempts_follow_the_record_not_the_spec() {
        let mut b = fork(Some(1));
        assert_eq!(fork_source(&b), Some(asked(Some(1), None)));
        let failed = RestoreStatus {
            attempt: 1,
            from_attempt: 2,
            from_run: Some("a".into()),
            from_uid: Some("u1".into()),
            outcome: RestoreOutcome::Failed,
            ..RestoreStatus::default()
        };
        b.status = Some(SandboxRunStatus {
            attempts: vec![AttemptStatus {
                index: 1,
                ..AttemptStatus::default()
            }],
            restores: vec![failed.clone()],
            ..SandboxRunStatus::default()
        });
        // The spec changed (the webhook bypassed): the record wins.
        b.spec
            .workspace
            .as_mut()
            .unwrap()
            .from
            .as_mut()
            .unwrap()
            .run = "other".into();
        assert_eq!(fork_source(&b), Some(asked(Some(2), Some("u1"))));
        // Once an attempt was restored from it, the fork is past its source.
        let status = b.status.as_mut().unwrap();
        status.restores[0].outcome = RestoreOutcome::Restored;
        assert_eq!(fork_source(&b), None);
    }

    fn checkpointed(uid: &str) -> SandboxRun {
        use crate::api::{CheckpointStatus, ReadBackStatus};
        let mut a = source(uid, 0, Phase::Running);
        let checkpoint =
            |index: u32, phases: &[ReadBackPhase], message: Option<&str>| CheckpointStatus {
                index,
                token: format!("t{index}"),
                attempt: Some(1),
                message: message.map(Into::into),
                read_back: phases
                    .iter()
                    .map(|&phase| ReadBackStatus {
                        path: "/out".into(),
                        phase,
                        ..ReadBackStatus::default()
                    })
                    .collect(),
                ..CheckpointStatus::default()
            };
        a.status.as_mut().unwrap().checkpoints = vec![
            checkpoint(1, &[ReadBackPhase::Drained, ReadBackPhase::Empty], None),
            checkpoint(2, &[ReadBackPhase::Drained, ReadBackPhase::Pending], None),
            checkpoint(3, &[ReadBackPhase::Drained, ReadBackPhase::Failed], None),
            checkpoint(4, &[ReadBackPhase::Capped], None),
            checkpoint(5, &[], Some("over the run's checkpoint limit")),
        ];
        a
    }

    fn asked_checkpoint(checkpoint: u32, uid: Option<&str>) -> ForkSource {
        ForkSource {
            checkpoint: Some(checkpoint),
            ..asked(None, uid)
        }
    }

    /// docs/contract.md "Pause, resume and fork": a fork of a running source's checkpoint, bound
    /// by its uid, only when the source records that checkpoint with every path saved whole.
    #[test]
    fn a_fork_restores_a_checkpoint_only_when_the_source_records_it_saved() {
        let b = fork(None);
        let a = checkpointed("u1");
        let (whose, generation) = bind(&b, Some(&a), &asked_checkpoint(1, None)).unwrap();
        assert_eq!((whose.name.as_str(), whose.uid.as_str()), ("a", "u1"));
        assert_eq!(
            generation,
            Generation::Checkpoint {
                checkpoint: 1,
                attempt: 1
            }
        );
        // Still being taken, failed, capped, refused, or never taken.
        for checkpoint in [2, 3, 4, 5, 6] {
            assert_eq!(
                bind(&b, Some(&a), &asked_checkpoint(checkpoint, None)),
                Err(NotBound::NoSuchCheckpoint {
                    run: "a".into(),
                    checkpoint
                }),
                "checkpoint {checkpoint}"
            );
        }
        // Bound by the uid as an attempt is.
        assert!(matches!(
            bind(&b, Some(&a), &asked_checkpoint(1, Some("u0"))),
            Err(NotBound::Recreated { .. })
        ));
    }

    /// The webhook bypassed: a fork naming both an attempt and a checkpoint is refused by the
    /// operator, nothing read.
    #[test]
    fn a_fork_naming_both_an_attempt_and_a_checkpoint_is_refused_by_the_operator() {
        let b = fork(None);
        let a = checkpointed("u1");
        let both = ForkSource {
            checkpoint: Some(1),
            ..asked(Some(1), None)
        };
        assert!(matches!(
            bind(&b, Some(&a), &both),
            Err(NotBound::AttemptAndCheckpoint { .. })
        ));
    }

    /// The first restore's record of a checkpoint binds the later attempts to that checkpoint.
    #[test]
    fn a_forks_recorded_checkpoint_wins_over_the_spec() {
        let mut b = fork(None);
        b.spec
            .workspace
            .as_mut()
            .unwrap()
            .from
            .as_mut()
            .unwrap()
            .checkpoint = Some(1);
        assert_eq!(fork_source(&b), Some(asked_checkpoint(1, None)));
        b.status = Some(SandboxRunStatus {
            attempts: vec![AttemptStatus {
                index: 1,
                ..AttemptStatus::default()
            }],
            restores: vec![RestoreStatus {
                attempt: 1,
                from_attempt: 1,
                from_run: Some("a".into()),
                from_uid: Some("u1".into()),
                from_checkpoint: Some(7),
                outcome: RestoreOutcome::Failed,
                ..RestoreStatus::default()
            }],
            ..SandboxRunStatus::default()
        });
        assert_eq!(fork_source(&b), Some(asked_checkpoint(7, Some("u1"))));
    }

    /// docs/contract.md "Pause, resume and fork": the one manifest check takes the identity it
    /// expects — run, attempt, checkpoint or none, path — as its parameter: an attempt's manifest
    /// copied under a checkpoint's keys (or the reverse, or another checkpoint's) is refused.
    #[test]
    fn a_manifest_is_the_restores_only_for_that_run_generation_and_path() {
        use crate::store::{DrainOutcome, Manifest, ManifestContext, Stored};
        let whose = RunId {
            namespace: "ns".into(),
            name: "a".into(),
            uid: "u1".into(),
        };
        let ctx = ManifestContext {
            run: whose.clone(),
            declared_path: "/out".into(),
            index: 0,
            attempt: 1,
        };
        let keys = crate::store::object_keys(
            &object_store::path::Path::from("runs"),
            &whose,
            0,
            "/out",
            crate::api::Compression::None,
        );
        let stored = Stored {
            compression: crate::api::Compression::None,
            cap_bytes: 10,
        };
        let t = jiff::Timestamp::UNIX_EPOCH;
        let attempt_manifest = Manifest::new(&ctx, &keys, stored, &DrainOutcome::default(), t, t);
        let mut checkpoint_manifest = attempt_manifest.clone();
        checkpoint_manifest.checkpoint = Some(2);
        let cp = |checkpoint| Generation::Checkpoint {
            checkpoint,
            attempt: 1,
        };
        let at = (0, "/out");
        assert!(manifest_is(&checkpoint_manifest, &whose, cp(2), at));
        assert!(manifest_is(
            &attempt_manifest,
            &whose,
            Generation::Attempt(1),
            at
        ));
        assert!(!manifest_is(&attempt_manifest, &whose, cp(2), at));
        assert!(!manifest_is(
            &checkpoint_manifest,
            &whose,
            Generation::Attempt(1),
            at
        ));
        assert!(!manifest_is(&checkpoint_manifest, &whose, cp(3), at));
        let other = RunId {
            uid: "u2".into(),
            ..whose.clone()
        };
        assert!(!manifest_is(&checkpoint_manifest, &other, cp(2), at));
        assert!(!manifest_is(
            &checkpoint_manifest,
            &whose,
            cp(2),
            (1, "/out")
        ));
        assert!(!manifest_is(
            &checkpoint_manifest,
            &whose,
            cp(2),
            (0, "/other")
        ));
    }
}
