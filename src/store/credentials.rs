//! Credential failures of the object store: which errors mean "the store refused who we are" (a
//! final failure, not a transient one: retrying with the same key cannot succeed), and which
//! settings a user fixes for each backend. The drain reports them as a `Failed` path that names
//! the backend and the settings (docs/contract.md: a failed drain is never an empty set, and says
//! why).

/// Whether an object-store error is the store refusing the credentials (HTTP 401 or 403).
///
/// object_store maps a 401/403 to `Unauthenticated`/`PermissionDenied` on object requests, but
/// its list requests wrap the HTTP error in a `Generic` error whose only trace of the status is
/// its text (`… status code: 403 Forbidden …`; the retry error type is private). So a `Generic`
/// error counts when its message chain carries one of those two statuses.
pub fn is_refused(e: &object_store::Error) -> bool {
    match e {
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => true,
        object_store::Error::Generic { .. } => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text.push_str(&s.to_string());
                source = s.source();
            }
            text.contains("status code: 401 Unauthorized")
                || text.contains("status code: 403 Forbidden")
        }
        _ => false,
    }
}

/// [`is_refused`] for an error that crossed an `AsyncWrite` (the archive upload reports its
/// object-store errors as `io::Error`s wrapping them).
pub(crate) fn io_is_refused(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<object_store::Error>())
        .is_some_and(is_refused)
}

/// The backend a store URL's scheme names, as users know it.
pub(crate) fn backend_name(scheme: &str) -> &'static str {
    match scheme {
        "s3" => "S3",
        "gs" => "Google Cloud Storage",
        "az" => "Azure Blob Storage",
        "file" => "the local file store",
        "memory" => "the in-memory store",
        _ => "the object store",
    }
}

/// The settings that carry a backend's credentials: the `--store-option` keys, the environment
/// variables (the chart's `store.existingSecret`) and the platform identity, per scheme.
pub(crate) fn credential_settings(scheme: &str) -> &'static str {
    match scheme {
        "s3" => {
            "options access_key_id/secret_access_key (and session_token), or AWS_ACCESS_KEY_ID/\
             AWS_SECRET_ACCESS_KEY in the store Secret, or the IRSA role \
             (AWS_ROLE_ARN/AWS_WEB_IDENTITY_TOKEN_FILE)"
        }
        "gs" => {
            "option service_account (the path of a mounted service-account JSON file) or \
             service_account_key, or GOOGLE_SERVICE_ACCOUNT/GOOGLE_APPLICATION_CREDENTIALS, or \
             workload identity"
        }
        "az" => {
            "options account_name with access_key or sas_key (or client_id/client_secret/\
             tenant_id), or AZURE_STORAGE_ACCOUNT_NAME/AZURE_STORAGE_ACCOUNT_KEY in the store \
             Secret, or workload identity"
        }
        _ => "the store URL and its options",
    }
}

fn scheme_of(store_url: &str) -> String {
    url::Url::parse(store_url)
        .map(|u| u.scheme().to_string())
        .unwrap_or_default()
}

/// The message of a drain that failed because the store refused the credentials: the
/// operator's own (`tenant` None), or those of the namespace's store, whose ConfigMap
/// `tenant` names (`namespace/name`): its fix is that namespace's Secret, never the operator's
/// settings (docs/contract.md "A store per namespace").
pub(crate) fn refused_message(store_url: &str, tenant: Option<&str>, error: &str) -> String {
    let scheme = scheme_of(store_url);
    match tenant {
        None => format!(
            "{} refused the operator's credentials ({error}); not retried: fix {}",
            backend_name(&scheme),
            credential_settings(&scheme)
        ),
        Some(config_map) => format!(
            "{} refused the credentials of the namespace's store (ConfigMap {config_map}) \
             ({error}); not retried: fix {} in the Secret that ConfigMap's secretName names",
            backend_name(&scheme),
            tenant_secret_keys(&scheme)
        ),
    }
}

/// The keys of a tenant store's Secret that carry its credentials, per scheme.
fn tenant_secret_keys(scheme: &str) -> &'static str {
    match scheme {
        "s3" => "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN)",
        "gs" => "GOOGLE_SERVICE_ACCOUNT_KEY",
        "az" => {
            "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_KEY"
        }
        _ => "the credentials",
    }
}

/// What `files` adds when the store refused a reader's credentials.
pub(crate) fn reader_refused_hint(store_url: &str) -> String {
    let scheme = scheme_of(store_url);
    format!(
        "{} refused these credentials: fix {} (a reader needs list and read rights)",
        backend_name(&scheme),
        credential_settings(&scheme)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    fn denied() -> object_store::Error {
        object_store::Error::PermissionDenied {
            path: "k".into(),
            source: "403 AuthorizationFailure".into(),
        }
    }

    #[test]
    fn only_401_and_403_are_refusals() {
        assert!(is_refused(&denied()));
        assert!(is_refused(&object_store::Error::Unauthenticated {
            path: "k".into(),
            source: "401".into(),
        }));
        assert!(!is_refused(&object_store::Error::NotFound {
            path: "k".into(),
            source: "404".into(),
        }));
        assert!(!is_refused(&object_store::Error::Generic {
            store: "S3",
            source: "connection refused".into(),
        }));
        // A list request's 403, as object_store reports it.
        assert!(is_refused(&object_store::Error::Generic {
            store: "S3",
            source: "Error performing list request: Error performing GET http://s3/b?list-type=2 \
                     in 3ms - Server returned non-2xx status code: 403 Forbidden: <Error/>"
                .into(),
        }));
        assert!(!is_refused(&object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 503 Service Unavailable".into(),
        }));
    }

    #[test]
    fn a_refusal_is_found_through_the_upload_writer_and_the_store_error() {
        let io: std::io::Error = denied().into();
        assert!(io_is_refused(&io));
        assert!(!io_is_refused(&std::io::Error::other("broken pipe")));
        let store = StoreError::Object {
            op: "writing manifest",
            key: "k".into(),
            source: denied(),
        };
        assert!(store.is_refused());
        assert!(!StoreError::NotFound { key: "k".into() }.is_refused());
    }

    #[test]
    fn the_message_names_the_backend_and_the_settings_to_fix() {
        let m = refused_message("az://runs/prod", None, "403");
        assert!(m.starts_with("Azure Blob Storage refused"), "{m}");
        assert!(
            m.contains("access_key") && m.contains("AZURE_STORAGE_ACCOUNT_KEY"),
            "{m}"
        );
        let m = refused_message("s3://b/p", None, "403");
        assert!(
            m.starts_with("S3 refused") && m.contains("secret_access_key"),
            "{m}"
        );
        let m = reader_refused_hint("s3://b/p");
        assert!(
            m.starts_with("S3 refused these credentials") && m.contains("AWS_SECRET_ACCESS_KEY"),
            "{m}"
        );
        let m = refused_message("gs://b/p", None, "401");
        assert!(
            m.starts_with("Google Cloud Storage refused") && m.contains("service_account"),
            "{m}"
        );
    }

    #[test]
    fn a_tenant_store_s_refusal_names_its_config_map_and_secret_keys_not_the_operator_s_settings() {
        for (url, key) in [
            ("s3://t/p", "AWS_SECRET_ACCESS_KEY"),
            ("gs://t/p", "GOOGLE_SERVICE_ACCOUNT_KEY"),
            ("az://t/p", "AZURE_STORAGE_ACCOUNT_KEY"),
        ] {
            let m = refused_message(url, Some("team-a/sandboxrun-store"), "403");
            assert!(m.contains("ConfigMap team-a/sandboxrun-store"), "{m}");
            assert!(m.contains(key) && m.contains("Secret"), "{m}");
            assert!(!m.contains("operator"), "{m}");
            assert!(
                !m.contains("IRSA") && !m.contains("workload identity"),
                "{m}"
            );
        }
    }
}
