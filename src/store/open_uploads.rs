//! Open multipart uploads of an archive key, aborted before a new attempt uploads it
//! (docs/contract.md, "What the store holds across attempts").
//!
//! A cancelled attempt aborts its own upload from a drop guard (`crate::store::upload_guard`), but a
//! process killed outright (SIGKILL, OOM, node loss) runs no guard and leaves its upload open:
//! parts billed and invisible. object_store has no API to list open uploads, so for an `s3://`
//! store this module speaks the two S3 calls itself, before each attempt of an archive key:
//!
//! - `ListMultipartUploads` (`GET /<bucket>?uploads&prefix=<key>`), paged, bounded;
//! - `AbortMultipartUpload` (`DELETE /<bucket>/<key>?uploadId=<id>`) for every upload whose key is
//!   exactly the archive key (a key that only shares the prefix is someone else's).
//!
//! Requests are signed with object_store's own SigV4 signer ([`AwsAuthorizer`]) and the
//! credentials of object_store's provider for the same settings ([`AmazonS3::credentials`]), so
//! static keys, IRSA/web identity, ECS and IMDS credentials work alike; the endpoint, region and
//! path style come from the same options the store is built from.
//!
//! This clean-up never fails a drain. A server without the listing (501, 405, a 404 that is not
//! `NoSuchUpload`) is logged at debug level; a 401/403 is warned about once per process, naming
//! the permission to grant (`s3:ListBucketMultipartUploads`, `s3:AbortMultipartUpload`); anything
//! else is a warning, and the attempt goes ahead. Other backends have nothing to do here: Azure
//! discards uncommitted blocks after 7 days by itself, and an unfinished GCS XML multipart upload
//! is left to the bucket's lifecycle rule (docs/operations.md).
//!
//! [`AmazonS3::credentials`]: object_store::aws::AmazonS3::credentials

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use object_store::aws::{AmazonS3ConfigKey, AwsAuthorizer, AwsCredential};
use object_store::client::{
    HttpClient, HttpConnector, HttpRequest, HttpRequestBody, ReqwestConnector,
};
use object_store::path::Path;
use object_store::{ClientConfigKey, ClientOptions};
use prometheus::{IntCounterVec, Opts};
use serde::Deserialize;
use tracing::{debug, info, warn};

/// The counter of open uploads found before an attempt (`sandboxrun_` + this; docs/operations.md).
pub(crate) const OPEN_UPLOADS_METRIC: &str = "open_multipart_uploads_total";

/// Most bytes of one response read into memory (a full page of 1,000 uploads is ~300 KiB).
pub(crate) const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// Most listing pages read for one key: open uploads of one key are a handful, not thousands.
pub(crate) const MAX_PAGES: usize = 10;
/// The longest the clean-up may hold up an attempt.
pub(crate) const BUDGET: Duration = Duration::from_secs(30);

/// The permission a listing needs.
pub const LIST_PERMISSION: &str = "s3:ListBucketMultipartUploads";
/// The permission an abort needs.
pub(crate) const ABORT_PERMISSION: &str = "s3:AbortMultipartUpload";

/// Why the open uploads of a key could not be listed or aborted.
#[derive(Debug, thiserror::Error)]
pub enum OpenUploadsError {
    /// The store settings do not configure an S3 client.
    #[error("configuring the S3 client for open uploads: {0}")]
    Config(#[source] object_store::Error),
    /// A setting is not valid (the endpoint is not a URL, ...).
    #[error("the S3 settings are not usable for listing open uploads: {0}")]
    Settings(String),
    /// The credential provider failed.
    #[error("getting S3 credentials: {0}")]
    Credentials(#[source] object_store::Error),
    /// The request could not be built or signed.
    #[error("{op}: building the request: {reason}")]
    Request {
        /// The S3 operation.
        op: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The request did not get a response.
    #[error("{op}: {source}")]
    Http {
        /// The S3 operation.
        op: &'static str,
        /// The transport error.
        source: object_store::client::HttpError,
    },
    /// The server does not implement the listing (s3s-fs, for one).
    #[error("the S3 server does not implement ListMultipartUploads (HTTP {status})")]
    Unsupported {
        /// The HTTP status.
        status: u16,
    },
    /// The credentials lack a permission (or are refused outright: the code says which).
    #[error("{op} refused (HTTP {status} {code}): the credentials need {permission}")]
    Forbidden {
        /// The S3 operation.
        op: &'static str,
        /// The HTTP status.
        status: u16,
        /// The S3 error code (AccessDenied, SignatureDoesNotMatch, ...), when the body names one.
        code: String,
        /// The permission to grant.
        permission: &'static str,
    },
    /// Any other error status.
    #[error("{op}: HTTP {status} {code}")]
    Status {
        /// The S3 operation.
        op: &'static str,
        /// The HTTP status.
        status: u16,
        /// The S3 error code, when the body names one.
        code: String,
    },
    /// The response body is larger than [`MAX_RESPONSE_BYTES`].
    #[error("{op}: the response is larger than {MAX_RESPONSE_BYTES} bytes")]
    TooLarge {
        /// The S3 operation.
        op: &'static str,
    },
    /// The listing is not a ListMultipartUploadsResult.
    #[error("the listing of open uploads is not valid XML of the expected shape: {0}")]
    Xml(String),
    /// The listing says it is truncated but gives no way on, or repeats itself.
    #[error(
        "the listing of open uploads does not advance past {key_marker:?}/{upload_id_marker:?}"
    )]
    Stuck {
        /// The last key marker.
        key_marker: String,
        /// The last upload-id marker.
        upload_id_marker: String,
    },
}

// ---------------------------------------------------------------------------------------------
// Pure: the listing, the URLs, the verdicts
// ---------------------------------------------------------------------------------------------

/// One page of `ListMultipartUploads`, as far as the clean-up needs it.
#[derive(Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename = "ListMultipartUploadsResult")]
pub(crate) struct Listing {
    /// Whether more pages follow.
    #[serde(rename = "IsTruncated", default)]
    pub is_truncated: bool,
    /// Where the next page starts (key).
    #[serde(rename = "NextKeyMarker", default)]
    pub next_key_marker: Option<String>,
    /// Where the next page starts (upload id).
    #[serde(rename = "NextUploadIdMarker", default)]
    pub next_upload_id_marker: Option<String>,
    /// The open uploads of this page.
    #[serde(rename = "Upload", default)]
    pub uploads: Vec<OpenUpload>,
}

/// One open upload.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub(crate) struct OpenUpload {
    /// Its object key.
    #[serde(rename = "Key")]
    pub key: String,
    /// Its upload id.
    #[serde(rename = "UploadId")]
    pub upload_id: String,
}

/// An S3 error body (`<Error><Code>..</Code></Error>`).
#[derive(Debug, Deserialize)]
#[serde(rename = "Error")]
struct ErrorBody {
    #[serde(rename = "Code", default)]
    code: String,
}

/// Parses one page of the listing. Garbage, hostile or truncated XML is an error, never a panic.
pub(crate) fn parse_listing(body: &[u8]) -> Result<Listing, OpenUploadsError> {
    let text = std::str::from_utf8(body).map_err(|e| OpenUploadsError::Xml(e.to_string()))?;
    // The deserializer does not check the root element's name: an `<Error>` document would read
    // as an empty listing.
    match root_element(text)?.as_str() {
        "ListMultipartUploadsResult" => {}
        other => {
            return Err(OpenUploadsError::Xml(format!(
                "the root element is <{other}>, not <ListMultipartUploadsResult>"
            )))
        }
    }
    quick_xml::de::from_str(text).map_err(|e| OpenUploadsError::Xml(e.to_string()))
}

/// The local name of the document's root element.
fn root_element(text: &str) -> Result<String, OpenUploadsError> {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_str(text);
    loop {
        match reader.read_event() {
            Ok(Event::Start(e) | Event::Empty(e)) => {
                return Ok(String::from_utf8_lossy(e.local_name().as_ref()).into_owned())
            }
            Ok(Event::Eof) => return Err(OpenUploadsError::Xml("no root element".into())),
            Ok(_) => {}
            Err(e) => return Err(OpenUploadsError::Xml(e.to_string())),
        }
    }
}

/// The S3 error code of an error body, if it has one.
pub(crate) fn error_code(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let parsed: ErrorBody = quick_xml::de::from_str(text).ok()?;
    (!parsed.code.is_empty()).then_some(parsed.code)
}

/// The upload ids of `listing` whose key is exactly `key`: a listing by prefix also returns
/// `key-other` and `key/below`, which belong to other paths and are left alone.
pub(crate) fn uploads_of_key<'a>(
    listing: &'a Listing,
    key: &'a str,
) -> impl Iterator<Item = &'a str> {
    listing
        .uploads
        .iter()
        .filter(move |u| u.key == key)
        .map(|u| u.upload_id.as_str())
}

/// What a listing's non-2xx status means.
pub(crate) fn listing_failure(status: u16, body: &[u8]) -> ListingFailure {
    let code = error_code(body);
    match status {
        // gofakes3 answers a bucket that never had an upload with NoSuchUpload: nothing is open.
        404 if code.as_deref() == Some("NoSuchUpload") => ListingFailure::NothingOpen,
        404 | 405 | 501 => ListingFailure::Unsupported,
        _ if code.as_deref() == Some("NotImplemented") => ListingFailure::Unsupported,
        401 | 403 => ListingFailure::Forbidden,
        _ => ListingFailure::Other(code.unwrap_or_default()),
    }
}

/// See [`listing_failure`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ListingFailure {
    /// The server says no upload is open.
    NothingOpen,
    /// The server does not implement the listing.
    Unsupported,
    /// The credentials may not list.
    Forbidden,
    /// Anything else (the S3 error code, possibly empty).
    Other(String),
}

/// Where the next page starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Marker {
    /// `key-marker`.
    pub key: String,
    /// `upload-id-marker`.
    pub upload_id: String,
}

/// The marker of the page after `listing`: None when it is the last. A truncated page without
/// markers, or with the markers it was asked with, would loop forever: an error.
pub(crate) fn next_marker(
    listing: &Listing,
    asked: Option<&Marker>,
) -> Result<Option<Marker>, OpenUploadsError> {
    if !listing.is_truncated {
        return Ok(None);
    }
    let next = Marker {
        key: listing.next_key_marker.clone().unwrap_or_default(),
        upload_id: listing.next_upload_id_marker.clone().unwrap_or_default(),
    };
    if next.key.is_empty() || asked == Some(&next) {
        return Err(OpenUploadsError::Stuck {
            key_marker: next.key,
            upload_id_marker: next.upload_id,
        });
    }
    Ok(Some(next))
}

/// The bucket's base URL, as object_store computes it: with an endpoint, `<endpoint>/<bucket>`
/// (path style) or the endpoint itself (virtual-hosted style: it names the bucket); without one,
/// AWS's regional endpoint.
pub(crate) fn bucket_endpoint(
    endpoint: Option<&str>,
    bucket: &str,
    region: &str,
    virtual_hosted: bool,
) -> Result<url::Url, OpenUploadsError> {
    let base = match (endpoint, virtual_hosted) {
        (Some(e), true) => e.trim_end_matches('/').to_string(),
        (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
        (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
        (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
    };
    url::Url::parse(&base)
        .map_err(|e| OpenUploadsError::Settings(format!("the bucket URL {base:?}: {e}")))
}

/// `GET <bucket>?uploads&prefix=<key>[&key-marker=..&upload-id-marker=..]`.
pub(crate) fn list_url(bucket: &url::Url, key: &str, marker: Option<&Marker>) -> url::Url {
    let mut url = bucket.clone();
    url.set_query(None);
    {
        let mut q = url.query_pairs_mut();
        q.append_key_only("uploads");
        q.append_pair("prefix", key);
        if let Some(m) = marker {
            q.append_pair("key-marker", &m.key);
            if !m.upload_id.is_empty() {
                q.append_pair("upload-id-marker", &m.upload_id);
            }
        }
    }
    url
}

/// `DELETE <bucket>/<key>?uploadId=<id>`, every key segment percent-encoded.
pub(crate) fn abort_url(
    bucket: &url::Url,
    key: &str,
    upload_id: &str,
) -> Result<url::Url, OpenUploadsError> {
    let mut url = bucket.clone();
    url.set_query(None);
    url.path_segments_mut()
        .map_err(|()| OpenUploadsError::Settings(format!("{bucket} cannot take a path")))?
        .pop_if_empty()
        .extend(key.split('/'));
    url.query_pairs_mut().append_pair("uploadId", upload_id);
    Ok(url)
}

/// Whether an object_store boolean setting says yes (its own parser's spellings).
fn truthy(value: Option<String>) -> bool {
    value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "true" | "1" | "yes" | "on"
        )
    })
}

// ---------------------------------------------------------------------------------------------
// I/O: the client
// ---------------------------------------------------------------------------------------------

/// The clean-up's S3 client for one store. Built once, shared by every drain.
#[derive(Debug)]
pub struct OpenUploads {
    http: HttpClient,
    credentials: object_store::aws::AwsCredentialProvider,
    bucket: url::Url,
    region: String,
    sign: bool,
    sign_payload: bool,
    request_payer: bool,
    warned_list: AtomicBool,
    warned_abort: AtomicBool,
    counter: IntCounterVec,
}

/// What one clean-up did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cleared {
    /// Open uploads of exactly the key.
    pub found: usize,
    /// Of those, aborted.
    pub aborted: usize,
}

/// The client options object_store's S3 builder holds, copied key by key (the builder does not
/// hand them out): TLS, proxy and timeouts apply to these requests as to the store's.
const CLIENT_KEYS: &[ClientConfigKey] = &[
    ClientConfigKey::AllowHttp,
    ClientConfigKey::AllowInvalidCertificates,
    ClientConfigKey::NoSystemCertificates,
    ClientConfigKey::ConnectTimeout,
    ClientConfigKey::Timeout,
    ClientConfigKey::ReadTimeout,
    ClientConfigKey::ProxyUrl,
    ClientConfigKey::ProxyCaCertificate,
    ClientConfigKey::ProxyExcludes,
    ClientConfigKey::Http1Only,
    ClientConfigKey::Http2Only,
    ClientConfigKey::UserAgent,
];

impl OpenUploads {
    /// The clean-up for the store at `url` with `options` (as `crate::store::store_from_url`
    /// takes them): Some for `s3://`, None for every other scheme (nothing to do there).
    pub fn for_store(
        url: &str,
        options: &[(String, String)],
    ) -> Result<Option<OpenUploads>, OpenUploadsError> {
        let parsed = url::Url::parse(url).map_err(|e| OpenUploadsError::Settings(e.to_string()))?;
        if parsed.scheme() != "s3" {
            return Ok(None);
        }
        let bucket = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| OpenUploadsError::Settings("the URL names no bucket".into()))?;
        // The store's own settings, validated as the store validates them.
        let builder = super::StoreConfig::new(url, options)
            .and_then(|config| config.s3_builder())
            .map_err(|e| OpenUploadsError::Settings(e.to_string()))?;
        let get = |key: AmazonS3ConfigKey| builder.get_config_value(&key);
        if truthy(get(AmazonS3ConfigKey::S3Express)) {
            debug!("S3 Express One Zone buckets are not cleaned of open uploads before an attempt");
            return Ok(None);
        }
        let region = get(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".to_string());
        let endpoint =
            get(AmazonS3ConfigKey::S3Endpoint).or_else(|| get(AmazonS3ConfigKey::Endpoint));
        let bucket_url = bucket_endpoint(
            endpoint.as_deref(),
            bucket,
            &region,
            truthy(get(AmazonS3ConfigKey::VirtualHostedStyleRequest)),
        )?;
        let sign = !truthy(get(AmazonS3ConfigKey::SkipSignature));
        let sign_payload = !truthy(get(AmazonS3ConfigKey::UnsignedPayload));
        let request_payer = truthy(get(AmazonS3ConfigKey::RequestPayer));
        let mut client = ClientOptions::new();
        for key in CLIENT_KEYS {
            if let Some(v) = get(AmazonS3ConfigKey::Client(*key)) {
                client = client.with_config(*key, v);
            }
        }
        let http = ReqwestConnector::default()
            .connect(&client)
            .map_err(OpenUploadsError::Config)?;
        let credentials = builder
            .build()
            .map_err(OpenUploadsError::Config)?
            .credentials()
            .clone();
        let counter = IntCounterVec::new(
            Opts::new(
                OPEN_UPLOADS_METRIC,
                "Open multipart uploads of an archive key found before an attempt, by outcome",
            )
            .namespace("sandboxrun"),
            &["outcome"],
        )
        .map_err(|e| OpenUploadsError::Settings(e.to_string()))?;
        Ok(Some(OpenUploads {
            http,
            credentials,
            bucket: bucket_url,
            region,
            sign,
            sign_payload,
            request_payer,
            warned_list: AtomicBool::new(false),
            warned_abort: AtomicBool::new(false),
            counter,
        }))
    }

    /// The counter of uploads found before an attempt (`outcome` = `aborted` | `abort_failed`),
    /// to register into the operator's registry.
    pub fn metric(&self) -> IntCounterVec {
        self.counter.clone()
    }

    /// Lists the open uploads of exactly `key` and aborts each. An abort that fails is logged and
    /// counted, and the others still go ahead.
    pub async fn abort_open_uploads(&self, key: &Path) -> Result<Cleared, OpenUploadsError> {
        let key = key.to_string();
        let credential = if self.sign {
            Some(
                self.credentials
                    .get_credential()
                    .await
                    .map_err(OpenUploadsError::Credentials)?,
            )
        } else {
            None
        };
        let credential = credential.as_deref();
        let mut ids: Vec<String> = Vec::new();
        let mut marker: Option<Marker> = None;
        for _ in 0..MAX_PAGES {
            const OP: &str = "ListMultipartUploads";
            let url = list_url(&self.bucket, &key, marker.as_ref());
            let (status, body) = self.send(OP, http::Method::GET, &url, credential).await?;
            if !(200..300).contains(&status) {
                return match listing_failure(status, &body) {
                    ListingFailure::NothingOpen => Ok(Cleared::default()),
                    ListingFailure::Unsupported => Err(OpenUploadsError::Unsupported { status }),
                    ListingFailure::Forbidden => Err(OpenUploadsError::Forbidden {
                        op: OP,
                        status,
                        code: error_code(&body).unwrap_or_default(),
                        permission: LIST_PERMISSION,
                    }),
                    ListingFailure::Other(code) => Err(OpenUploadsError::Status {
                        op: OP,
                        status,
                        code,
                    }),
                };
            }
            let listing = parse_listing(&body)?;
            ids.extend(uploads_of_key(&listing, &key).map(str::to_string));
            marker = next_marker(&listing, marker.as_ref())?;
            if marker.is_none() {
                break;
            }
        }
        let mut cleared = Cleared {
            found: ids.len(),
            aborted: 0,
        };
        for id in &ids {
            match self.abort(&key, id, credential).await {
                Ok(()) => {
                    cleared.aborted += 1;
                    self.counter.with_label_values(&["aborted"]).inc();
                    info!(archive = %key, upload_id = %id, "aborted an open multipart upload of the archive key left by an earlier attempt");
                }
                Err(e) => {
                    self.counter.with_label_values(&["abort_failed"]).inc();
                    self.report(&e, &key);
                }
            }
        }
        Ok(cleared)
    }

    async fn abort(
        &self,
        key: &str,
        upload_id: &str,
        credential: Option<&AwsCredential>,
    ) -> Result<(), OpenUploadsError> {
        const OP: &str = "AbortMultipartUpload";
        let url = abort_url(&self.bucket, key, upload_id)?;
        let (status, body) = self
            .send(OP, http::Method::DELETE, &url, credential)
            .await?;
        match status {
            200..=299 => Ok(()),
            // Gone meanwhile (its own guard aborted it, or it completed): nothing left to do.
            404 => Ok(()),
            401 | 403 => Err(OpenUploadsError::Forbidden {
                op: OP,
                status,
                code: error_code(&body).unwrap_or_default(),
                permission: ABORT_PERMISSION,
            }),
            _ => Err(OpenUploadsError::Status {
                op: OP,
                status,
                code: error_code(&body).unwrap_or_default(),
            }),
        }
    }

    /// Sends one signed request with an empty body; returns the status and at most
    /// [`MAX_RESPONSE_BYTES`] of body.
    async fn send(
        &self,
        op: &'static str,
        method: http::Method,
        url: &url::Url,
        credential: Option<&AwsCredential>,
    ) -> Result<(u16, Vec<u8>), OpenUploadsError> {
        let mut request: HttpRequest = http::Request::builder()
            .method(method)
            .uri(url.as_str())
            .body(HttpRequestBody::empty())
            .map_err(|e| OpenUploadsError::Request {
                op,
                reason: e.to_string(),
            })?;
        if let Some(credential) = credential {
            AwsAuthorizer::new(credential, "s3", &self.region)
                .with_sign_payload(self.sign_payload)
                .with_request_payer(self.request_payer)
                .try_authorize(&mut request, None)
                .map_err(|e| OpenUploadsError::Request {
                    op,
                    reason: e.to_string(),
                })?;
        }
        let response = self
            .http
            .execute(request)
            .await
            .map_err(|source| OpenUploadsError::Http { op, source })?;
        let status = response.status().as_u16();
        let mut stream = response.into_body().bytes_stream();
        let mut body = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|source| OpenUploadsError::Http { op, source })?;
            if body.len().saturating_add(chunk.len()) > MAX_RESPONSE_BYTES {
                return Err(OpenUploadsError::TooLarge { op });
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, body))
    }

    /// Logs a clean-up error at the level it deserves: a missing permission once per process and
    /// operation (it is a setting to fix, not news on every attempt), an unsupported listing at
    /// debug level, anything else as a warning.
    fn report(&self, error: &OpenUploadsError, key: &str) {
        match error {
            OpenUploadsError::Unsupported { .. } => {
                debug!(archive = %key, error = %error, "open multipart uploads cannot be listed on this S3 server; the bucket's lifecycle rule is what removes uploads of killed processes");
            }
            OpenUploadsError::Forbidden { permission, .. } => {
                let flag = if *permission == LIST_PERMISSION {
                    &self.warned_list
                } else {
                    &self.warned_abort
                };
                if !flag.swap(true, Ordering::Relaxed) {
                    warn!(archive = %key, error = %error, permission, "the store credentials lack {permission}: open multipart uploads left by killed attempts are not cleaned before new attempts (warned once; the drains go on)");
                } else {
                    debug!(archive = %key, error = %error, "open multipart uploads not cleaned");
                }
            }
            _ => {
                warn!(archive = %key, error = %error, "could not clean the archive key's open multipart uploads; the attempt goes ahead");
            }
        }
    }
}

/// Before an attempt uploads `key`: aborts its open multipart uploads, within `budget`. Never
/// fails and never holds the attempt longer than `budget`; `cleaner` is None for stores other
/// than S3. Returns what it did (None when it could not tell).
pub async fn before_attempt(
    cleaner: Option<&OpenUploads>,
    key: &Path,
    budget: Duration,
) -> Option<Cleared> {
    let cleaner = cleaner?;
    match tokio::time::timeout(budget, cleaner.abort_open_uploads(key)).await {
        Ok(Ok(cleared)) => {
            debug!(archive = %key, found = cleared.found, aborted = cleared.aborted, "open multipart uploads of the archive key checked");
            Some(cleared)
        }
        Ok(Err(e)) => {
            cleaner.report(&e, key.as_ref());
            None
        }
        Err(_) => {
            warn!(archive = %key, budget = ?budget, "cleaning the archive key's open multipart uploads took too long; the attempt goes ahead");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "runs/ns/a/uid/00-out.tar";

    fn page(uploads: &[(&str, &str)], truncated: bool, next: Option<(&str, &str)>) -> String {
        let mut s = String::from(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>b</Bucket><Prefix>runs/ns/a/uid/00-out.tar</Prefix><MaxUploads>1000</MaxUploads>"#,
        );
        s.push_str(&format!("<IsTruncated>{truncated}</IsTruncated>"));
        if let Some((k, u)) = next {
            s.push_str(&format!(
                "<NextKeyMarker>{k}</NextKeyMarker><NextUploadIdMarker>{u}</NextUploadIdMarker>"
            ));
        }
        for (k, id) in uploads {
            s.push_str(&format!(
                "<Upload><Key>{k}</Key><UploadId>{id}</UploadId><Initiator><ID>x</ID></Initiator><StorageClass>STANDARD</StorageClass><Initiated>2026-11-30T23:37:36.328Z</Initiated></Upload>"
            ));
        }
        s.push_str("</ListMultipartUploadsResult>");
        s
    }

    #[test]
    fn a_listing_parses_and_only_the_exact_key_is_aborted() {
        let xml = page(
            &[
                (KEY, "id-1"),
                ("runs/ns/a/uid/00-out.tar-other", "id-2"),
                ("runs/ns/a/uid/00-out.tar/below", "id-3"),
                (KEY, "id-4"),
            ],
            false,
            None,
        );
        let listing = parse_listing(xml.as_bytes()).expect("parses");
        assert_eq!(listing.uploads.len(), 4);
        assert!(!listing.is_truncated);
        let ids: Vec<&str> = uploads_of_key(&listing, KEY).collect();
        assert_eq!(
            ids,
            vec!["id-1", "id-4"],
            "keys that only share the prefix are not aborted"
        );
        assert_eq!(next_marker(&listing, None).expect("last page"), None);
    }

    #[test]
    fn an_empty_listing_has_nothing_to_abort() {
        let listing = parse_listing(page(&[], false, None).as_bytes()).expect("parses");
        assert_eq!(listing, Listing::default());
        assert_eq!(uploads_of_key(&listing, KEY).count(), 0);
    }

    #[test]
    fn gofakes3_s_own_listing_parses() {
        let xml = br#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult>
  <Bucket>sandboxrun-test</Bucket>
  <MaxUploads>1000</MaxUploads>
  <Prefix>a/key</Prefix>
  <IsTruncated>false</IsTruncated>
  <Upload>
    <Key>a/key</Key>
    <UploadId>1</UploadId>
    <StorageClass>STANDARD</StorageClass>
    <Initiated>2026-11-30T23:37:36.328Z</Initiated>
  </Upload>
</ListMultipartUploadsResult>"#;
        let listing = parse_listing(xml).expect("parses");
        assert_eq!(
            uploads_of_key(&listing, "a/key").collect::<Vec<_>>(),
            vec!["1"]
        );
    }

    #[test]
    fn escaped_keys_are_compared_unescaped() {
        let xml = page(&[("runs/a&amp;b", "id-1")], false, None);
        let listing = parse_listing(xml.as_bytes()).expect("parses");
        assert_eq!(uploads_of_key(&listing, "runs/a&b").count(), 1);
        assert_eq!(uploads_of_key(&listing, "runs/a&amp;b").count(), 0);
    }

    #[test]
    fn hostile_or_garbage_listings_are_errors_not_panics() {
        let deep = "<a>".repeat(100_000);
        let deep_inside = format!(
            "<ListMultipartUploadsResult><Upload>{}",
            "<Key>".repeat(100_000)
        );
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("not xml", b"hello, world".to_vec()),
            ("not utf-8", vec![0xff, 0xfe, 0x3c, 0x00]),
            ("truncated", page(&[(KEY, "id-1")], false, None).as_bytes()[..200].to_vec()),
            ("another document", b"<Error><Code>NoSuchBucket</Code></Error>".to_vec()),
            ("an upload without its id", b"<ListMultipartUploadsResult><IsTruncated>false</IsTruncated><Upload><Key>k</Key></Upload></ListMultipartUploadsResult>".to_vec()),
            ("a boolean that is not", b"<ListMultipartUploadsResult><IsTruncated>perhaps</IsTruncated></ListMultipartUploadsResult>".to_vec()),
            ("an undefined entity", b"<ListMultipartUploadsResult><Upload><Key>&boom;</Key><UploadId>1</UploadId></Upload></ListMultipartUploadsResult>".to_vec()),
            ("a doctype with entities", br#"<!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><ListMultipartUploadsResult><Upload><Key>&b;</Key><UploadId>1</UploadId></Upload></ListMultipartUploadsResult>"#.to_vec()),
            ("unbalanced nesting", deep.into_bytes()),
            ("unbalanced nesting inside a listing", deep_inside.into_bytes()),
        ];
        for (what, body) in cases {
            let parsed = std::panic::catch_unwind(|| parse_listing(&body));
            let parsed = parsed.unwrap_or_else(|_| panic!("{what}: parsing panicked"));
            assert!(parsed.is_err(), "{what}: {parsed:?}");
        }
    }

    #[test]
    fn truncated_listings_page_on_and_a_stuck_one_is_an_error() {
        let first = parse_listing(page(&[(KEY, "id-1")], true, Some((KEY, "id-1"))).as_bytes())
            .expect("parses");
        let marker = next_marker(&first, None)
            .expect("advances")
            .expect("a next page");
        assert_eq!(
            marker,
            Marker {
                key: KEY.into(),
                upload_id: "id-1".into()
            }
        );
        // The server repeats the page it was asked for: an error, not an endless loop.
        assert!(matches!(
            next_marker(&first, Some(&marker)),
            Err(OpenUploadsError::Stuck { .. })
        ));
        // Truncated without a marker: no way on.
        let bare = parse_listing(page(&[], true, None).as_bytes()).expect("parses");
        assert!(matches!(
            next_marker(&bare, None),
            Err(OpenUploadsError::Stuck { .. })
        ));
    }

    #[test]
    fn listing_failures_are_classified() {
        let body = |code: &str| {
            format!("<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>m</Message></Error>")
        };
        assert_eq!(
            listing_failure(404, body("NoSuchUpload").as_bytes()),
            ListingFailure::NothingOpen
        );
        assert_eq!(
            listing_failure(404, body("NoSuchKey").as_bytes()),
            ListingFailure::Unsupported
        );
        assert_eq!(listing_failure(404, b""), ListingFailure::Unsupported);
        assert_eq!(listing_failure(405, b""), ListingFailure::Unsupported);
        assert_eq!(
            listing_failure(501, body("NotImplemented").as_bytes()),
            ListingFailure::Unsupported
        );
        assert_eq!(
            listing_failure(400, body("NotImplemented").as_bytes()),
            ListingFailure::Unsupported
        );
        assert_eq!(
            listing_failure(403, body("AccessDenied").as_bytes()),
            ListingFailure::Forbidden
        );
        assert_eq!(listing_failure(401, b""), ListingFailure::Forbidden);
        assert_eq!(
            listing_failure(500, body("InternalError").as_bytes()),
            ListingFailure::Other("InternalError".into())
        );
        assert_eq!(
            listing_failure(503, b"<html>"),
            ListingFailure::Other(String::new())
        );
    }

    #[test]
    fn requests_are_built_path_style_and_virtual_hosted_as_object_store_builds_them() {
        let path_style =
            bucket_endpoint(Some("http://127.0.0.1:19300/"), "bkt", "us-east-1", false)
                .expect("url");
        assert_eq!(path_style.as_str(), "http://127.0.0.1:19300/bkt");
        assert_eq!(
            list_url(&path_style, KEY, None).as_str(),
            "http://127.0.0.1:19300/bkt?uploads&prefix=runs%2Fns%2Fa%2Fuid%2F00-out.tar"
        );
        assert_eq!(
            list_url(
                &path_style,
                KEY,
                Some(&Marker {
                    key: KEY.into(),
                    upload_id: "u 1".into()
                })
            )
            .query(),
            Some("uploads&prefix=runs%2Fns%2Fa%2Fuid%2F00-out.tar&key-marker=runs%2Fns%2Fa%2Fuid%2F00-out.tar&upload-id-marker=u+1")
        );
        assert_eq!(
            abort_url(&path_style, KEY, "a/b+c=").expect("url").as_str(),
            "http://127.0.0.1:19300/bkt/runs/ns/a/uid/00-out.tar?uploadId=a%2Fb%2Bc%3D"
        );
        // A key segment that needs encoding is encoded, never taken for a path separator or query.
        assert_eq!(
            abort_url(&path_style, "runs/a?b#c d/x", "1")
                .expect("url")
                .as_str(),
            "http://127.0.0.1:19300/bkt/runs/a%3Fb%23c%20d/x?uploadId=1"
        );

        let aws_virtual = bucket_endpoint(None, "bkt", "eu-west-3", true).expect("url");
        assert_eq!(
            aws_virtual.as_str(),
            "https://bkt.s3.eu-west-3.amazonaws.com/"
        );
        assert_eq!(
            abort_url(&aws_virtual, KEY, "1").expect("url").as_str(),
            "https://bkt.s3.eu-west-3.amazonaws.com/runs/ns/a/uid/00-out.tar?uploadId=1"
        );
        assert_eq!(
            list_url(&aws_virtual, "k", None).as_str(),
            "https://bkt.s3.eu-west-3.amazonaws.com/?uploads&prefix=k"
        );
        let aws_path = bucket_endpoint(None, "bkt", "eu-west-3", false).expect("url");
        assert_eq!(aws_path.as_str(), "https://s3.eu-west-3.amazonaws.com/bkt");
        let custom_virtual =
            bucket_endpoint(Some("https://bkt.minio.example"), "bkt", "x", true).expect("url");
        assert_eq!(custom_virtual.as_str(), "https://bkt.minio.example/");
        assert!(bucket_endpoint(Some("not a url"), "bkt", "x", false).is_err());
    }

    #[test]
    fn only_s3_stores_get_a_cleaner() {
        assert!(OpenUploads::for_store("memory://", &[])
            .expect("ok")
            .is_none());
        assert!(OpenUploads::for_store("file:///tmp/x", &[])
            .expect("ok")
            .is_none());
        let opts = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let s3 = OpenUploads::for_store(
            "s3://bkt/prefix",
            &opts(&[
                ("endpoint", "http://127.0.0.1:1"),
                ("allow_http", "true"),
                ("access_key_id", "a"),
                ("secret_access_key", "s"),
                ("region", "eu-west-3"),
            ]),
        )
        .expect("ok")
        .expect("an S3 store has a cleaner");
        assert_eq!(s3.bucket.as_str(), "http://127.0.0.1:1/bkt");
        assert_eq!(s3.region, "eu-west-3");
        assert!(s3.sign);
    }

    #[tokio::test]
    async fn an_unreachable_server_never_fails_the_attempt() {
        let opts: Vec<(String, String)> = [
            ("endpoint", "http://127.0.0.1:9"),
            ("allow_http", "true"),
            ("access_key_id", "a"),
            ("secret_access_key", "s"),
            ("region", "us-east-1"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let s3 = OpenUploads::for_store("s3://bkt", &opts)
            .expect("ok")
            .expect("s3");
        let key = Path::from(KEY);
        assert!(s3.abort_open_uploads(&key).await.is_err());
        // The drain's entry point swallows it: no result, no error, no panic.
        assert_eq!(
            before_attempt(Some(&s3), &key, Duration::from_secs(20)).await,
            None
        );
        assert_eq!(
            before_attempt(None, &key, Duration::from_secs(20)).await,
            None
        );
    }
}
