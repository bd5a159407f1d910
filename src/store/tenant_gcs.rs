//! A tenant's gs:// store, the pure part (docs/contract.md "A store per namespace"): the
//! service-account key its Secret carries (`GOOGLE_SERVICE_ACCOUNT_KEY`, the JSON itself) judged
//! before it reaches the client. A service-account key names URLs the operator would call with
//! it, so each is an endpoint the platform's allowlist judges: `gcs_base_url` (where every request
//! and its bearer token go; default `https://storage.googleapis.com`) and `token_uri` (where a
//! client exchanges a signed assertion for a token; default `https://oauth2.googleapis.com/token`;
//! the client signs its own token today and never calls it, but a key naming one is judged all
//! the same). The key is refused unless it is a service account's with its private key; a field
//! outside the closed set of a service-account key's is refused by name (an unknown field may be
//! one a client calls); `disable_oauth` (unsigned requests) is refused. What reaches the client is
//! rebuilt from the judged fields only. No message ever carries a value of the key.

use serde_json::{Map, Value};

/// The Secret key holding the JSON (as the operator's own store Secret names it).
pub(crate) const SECRET_KEY: &str = "GOOGLE_SERVICE_ACCOUNT_KEY";
/// Where GCS requests go when the key names no `gcs_base_url`.
pub(crate) const DEFAULT_BASE_URL: &str = "https://storage.googleapis.com";
/// Where a token is asked for when the key names no `token_uri`.
pub(crate) const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

/// The fields a key's endpoints are in, and each one's default.
const ENDPOINT_FIELDS: &[(&str, &str)] = &[
    ("gcs_base_url", DEFAULT_BASE_URL),
    ("token_uri", DEFAULT_TOKEN_URI),
];
/// The fields a service-account key Google issues also carries: facts about the account and
/// documentation URLs no client of the operator's calls; accepted, and dropped before the key
/// reaches the client.
const DROPPED_FIELDS: &[&str] = &[
    "project_id",
    "client_id",
    "auth_uri",
    "auth_provider_x509_cert_url",
    "client_x509_cert_url",
];

/// A tenant's service-account key, judged: what the client gets, and the endpoints it names.
pub(crate) struct ServiceAccountKey {
    /// The key rebuilt from its judged fields (a credential: never logged).
    pub(crate) json: String,
    /// Each endpoint the key makes the operator call, with its field: `gcs_base_url` first.
    pub(crate) endpoints: Vec<(&'static str, String)>,
}

/// Why a tenant's service-account key is refused: its words name fields, never values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A field such a key does not have.
    #[error(
        "its {key} has the field {field:?}, which a tenant's service-account key may not carry \
         (accepted: {accepted}; a field a client might call is an endpoint the platform judges)",
        key = SECRET_KEY
    )]
    FieldNotAccepted {
        /// The field.
        field: String,
        /// The fields accepted, comma-separated.
        accepted: String,
    },
    /// Not a service account's key.
    #[error(
        "its {key} is not a service account's key (\"type\" is {found}; a tenant store signs with \
         a service account's own private key, never a user's refresh token or a federated \
         identity)",
        key = SECRET_KEY
    )]
    NotServiceAccount {
        /// What its `type` is, in words.
        found: String,
    },
    /// A field it needs is missing or empty.
    #[error(
        "its {key} lacks {0:?} (a tenant store signs with its own service-account key, never the \
         operator's identity)",
        key = SECRET_KEY
    )]
    Lacks(String),
    /// A field is not a string.
    #[error("its {key}'s {0:?} is not a string", key = SECRET_KEY)]
    NotAString(String),
    /// `private_key` is not a PEM private key.
    #[error("its {key}'s \"private_key\" is not a PEM private key", key = SECRET_KEY)]
    NotPem,
    /// JSON, but not an object.
    #[error(
        "its {key} is not a JSON object (a service-account key file's content)",
        key = SECRET_KEY
    )]
    NotAnObject,
    /// Not JSON: where it breaks, never what it says.
    #[error(
        "its {key} is not JSON ({class} error at line {line}, column {column}; a service-account \
         key file's content)",
        key = SECRET_KEY
    )]
    NotJson {
        /// serde_json's class of error, as `Debug` prints it.
        class: String,
        /// Its line.
        line: usize,
        /// Its column.
        column: usize,
    },
    /// `disable_oauth` set.
    #[error(
        "its {key} sets \"disable_oauth\" (unsigned requests): a tenant store signs with its own \
         key",
        key = SECRET_KEY
    )]
    Unsigned,
    /// A universe other than Google's public one.
    #[error(
        "its {key}'s \"universe_domain\" is not googleapis.com (another universe's endpoints are \
         named with gcs_base_url and token_uri)",
        key = SECRET_KEY
    )]
    OtherUniverse,
}

/// The key `text` judged: refused (with a reason naming fields, never values) unless it is a
/// service account's key with its private key and only the fields such a key has.
pub(crate) fn judged(text: &str) -> Result<ServiceAccountKey, KeyError> {
    let fields = parsed(text)?;
    let mut accepted: Vec<&str> = vec![
        "type",
        "private_key",
        "private_key_id",
        "client_email",
        "universe_domain",
        "disable_oauth",
    ];
    accepted.extend(ENDPOINT_FIELDS.iter().map(|(f, _)| *f));
    accepted.extend(DROPPED_FIELDS);
    if let Some(field) = fields.keys().find(|k| !accepted.contains(&k.as_str())) {
        return Err(KeyError::FieldNotAccepted {
            field: field.clone(),
            accepted: accepted.join(", "),
        });
    }
    match fields.get("type").and_then(Value::as_str) {
        Some("service_account") => {}
        other => {
            return Err(KeyError::NotServiceAccount {
                found: type_words(other),
            })
        }
    }
    let text_field = |name: &str| -> Result<String, KeyError> {
        match fields.get(name) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(Value::String(_)) | None => Err(KeyError::Lacks(name.to_string())),
            Some(_) => Err(KeyError::NotAString(name.to_string())),
        }
    };
    let private_key = text_field("private_key")?;
    if !(private_key.contains("-----BEGIN") && private_key.contains("PRIVATE KEY-----")) {
        return Err(KeyError::NotPem);
    }
    let private_key_id = text_field("private_key_id")?;
    let client_email = text_field("client_email")?;
    refuse_unsigned_and_other_universes(&fields)?;
    let mut rebuilt = Map::new();
    rebuilt.insert("type".into(), "service_account".into());
    rebuilt.insert("private_key".into(), private_key.into());
    rebuilt.insert("private_key_id".into(), private_key_id.into());
    rebuilt.insert("client_email".into(), client_email.into());
    let mut endpoints = Vec::new();
    for (field, default) in ENDPOINT_FIELDS {
        let url = match fields.get(*field) {
            None => default.to_string(),
            Some(Value::String(url)) => {
                let url = url.trim().trim_end_matches('/').to_string();
                rebuilt.insert((*field).into(), url.clone().into());
                url
            }
            Some(_) => return Err(KeyError::NotAString((*field).to_string())),
        };
        endpoints.push((*field, url));
    }
    Ok(ServiceAccountKey {
        json: Value::Object(rebuilt).to_string(),
        endpoints,
    })
}

/// The key's fields; a text that is not a JSON object is refused with where it breaks, never
/// with what it says.
fn parsed(text: &str) -> Result<Map<String, Value>, KeyError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(KeyError::NotAnObject),
        Err(e) => Err(KeyError::NotJson {
            class: format!("{:?}", e.classify()),
            line: e.line(),
            column: e.column(),
        }),
    }
}

/// `disable_oauth: true` (requests unsigned) and a universe other than Google's public one are
/// refused.
fn refuse_unsigned_and_other_universes(fields: &Map<String, Value>) -> Result<(), KeyError> {
    match fields.get("disable_oauth") {
        None | Some(Value::Bool(false)) => {}
        Some(_) => return Err(KeyError::Unsigned),
    }
    match fields.get("universe_domain") {
        None => Ok(()),
        Some(Value::String(d)) if d == "googleapis.com" => Ok(()),
        Some(_) => Err(KeyError::OtherUniverse),
    }
}

/// How an error names a key's `type` (only the types Google issues are echoed).
fn type_words(found: Option<&str>) -> String {
    const KNOWN: &[&str] = &[
        "authorized_user",
        "external_account",
        "external_account_authorized_user",
        "impersonated_service_account",
        "gdch_service_account",
    ];
    match found {
        Some(t) if KNOWN.contains(&t) => format!("{t:?}"),
        Some(_) => "not one Google issues".into(),
        None => "missing".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_gets_the_judged_fields_only() {
        let key = serde_json::json!({
            "type": "service_account",
            "private_key": "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n",
            "private_key_id": "id",
            "client_email": "a@b.iam.gserviceaccount.com",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/a",
            "project_id": "p",
            "gcs_base_url": "http://127.0.0.1:19100/",
            "disable_oauth": false,
        });
        let judged = judged(&key.to_string()).expect("a service account's key");
        let rebuilt: Map<String, Value> = serde_json::from_str(&judged.json).expect("json");
        let mut fields: Vec<&str> = rebuilt.keys().map(String::as_str).collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            [
                "client_email",
                "gcs_base_url",
                "private_key",
                "private_key_id",
                "type"
            ]
        );
        assert_eq!(rebuilt["gcs_base_url"], "http://127.0.0.1:19100");
        assert_eq!(
            judged.endpoints,
            [
                ("gcs_base_url", "http://127.0.0.1:19100".to_string()),
                ("token_uri", DEFAULT_TOKEN_URI.to_string())
            ]
        );
    }
}
