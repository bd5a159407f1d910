//! Request heads of the egress proxy: reading one (bounded in size; the caller bounds the time),
//! what it asks for ([`Target`]), and the head a plain-HTTP request is forwarded with
//! ([`forward_head`]: its `Host` is the host the verdict was on, never the client's).

use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest request head the proxy reads.
pub(crate) const MAX_HEAD: usize = 16 * 1024;

/// A parsed request head.
pub(crate) struct Head {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    /// Bytes read past the head (the start of a body, or of the tunnel).
    pub(crate) rest: Vec<u8>,
}

/// Reads a request head; None when the peer closed first or sent something that is not one.
pub(crate) async fn read_head<R: AsyncRead + Unpin>(
    stream: &mut R,
) -> Result<Option<Head>, std::io::Error> {
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let head = Head {
                    method: req.method.unwrap_or_default().to_string(),
                    target: req.path.unwrap_or_default().to_string(),
                    headers: req
                        .headers
                        .iter()
                        .map(|h| (h.name.to_string(), h.value.to_vec()))
                        .collect(),
                    rest: buf[len..].to_vec(),
                };
                return Ok(Some(head));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            _ => return Ok(None),
        }
    }
}

/// The value of the first header `name` (case-insensitive).
pub(crate) fn header<'a>(head: &'a Head, name: &str) -> Option<&'a [u8]> {
    head.headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

/// `host`, `port` of a CONNECT target (`host:port`, `[v6]:port`).
pub(crate) fn split_authority(authority: &str) -> Option<(String, u16)> {
    let (host, port) = authority.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then(|| (host.to_string(), port))
}

/// Where a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// `CONNECT` (a tunnel) rather than a plain-HTTP request.
    pub(crate) connect: bool,
    /// The host the verdict is on (no brackets).
    pub(crate) host: String,
    /// The port.
    pub(crate) port: u16,
    /// Plain HTTP: the origin-form target (`/path?query`).
    pub(crate) path: String,
    /// Plain HTTP: the `Host` value the request is forwarded with (the URI's authority).
    pub(crate) authority: String,
}

/// What `head` asks for; Err: why it is not a request this proxy serves (a 400).
pub(crate) fn target_of(head: &Head) -> Result<Target, &'static str> {
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(&head.target).ok_or("CONNECT wants host:port\n")?;
        return Ok(Target {
            connect: true,
            host,
            port,
            path: String::new(),
            authority: head.target.clone(),
        });
    }
    const NOT_ABSOLUTE: &str =
        "a proxied request is `CONNECT host:port` or an absolute http:// URI\n";
    let url = url::Url::parse(&head.target).map_err(|_| NOT_ABSOLUTE)?;
    let bracketed = match (url.scheme(), url.host_str()) {
        ("http", Some(h)) if !h.is_empty() => h.to_string(),
        _ => return Err(NOT_ABSOLUTE),
    };
    let host = bracketed
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&bracketed)
        .to_string();
    let mut path = url.path().to_string();
    if let Some(q) = url.query() {
        path.push('?');
        path.push_str(q);
    }
    let authority = match url.port() {
        Some(p) => format!("{bracketed}:{p}"),
        None => bracketed,
    };
    Ok(Target {
        connect: false,
        host,
        port: url.port().unwrap_or(80),
        path,
        authority,
    })
}

/// The head a plain-HTTP request is forwarded with: origin form, the client's headers less the
/// proxy's own and hop-by-hop ones, `Host` replaced by the URI's authority (RFC 9112 §3.2.2: a
/// proxy ignores the received `Host` of an absolute-form request; forwarding it would let a
/// request judged on an allowed host be routed by the upstream to a denied one), and
/// `Connection: close`.
pub(crate) fn forward_head(head: &Head, target: &Target) -> Vec<u8> {
    let mut out = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\n",
        head.method, target.path, target.authority
    )
    .into_bytes();
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        if matches!(
            lower.as_str(),
            "host" | "proxy-authorization" | "proxy-connection" | "connection" | "keep-alive"
        ) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// The name the proxy resolves for `host`: fully qualified (a trailing dot), so the resolver
/// never applies the pod's search list (`github.com` must not become
/// `github.com.<ns>.svc.cluster.local`, nor reach service `github` in namespace `com`); an IP
/// literal is left as it is.
pub(crate) fn fqdn(host: &str) -> String {
    if host.parse::<std::net::IpAddr>().is_ok() || host.ends_with('.') {
        host.to_string()
    } else {
        format!("{host}.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: &str, target: &str, headers: &[(&str, &str)]) -> Head {
        Head {
            method: method.into(),
            target: target.into(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            rest: Vec::new(),
        }
    }

    #[test]
    fn authorities_split() {
        assert_eq!(split_authority("a.com:443"), Some(("a.com".into(), 443)));
        assert_eq!(split_authority("[::1]:80"), Some(("::1".into(), 80)));
        assert_eq!(split_authority("a.com"), None);
        assert_eq!(split_authority(":80"), None);
    }

    #[test]
    fn targets_parse() {
        let t = target_of(&head("CONNECT", "a.com:8443", &[])).ok();
        assert_eq!(
            t.map(|t| (t.connect, t.host, t.port)),
            Some((true, "a.com".into(), 8443))
        );
        let Ok(t) = target_of(&head("GET", "http://[::1]:8080/x?y=1", &[])) else {
            panic!("an absolute URI parses")
        };
        assert_eq!((t.host.as_str(), t.port), ("::1", 8080));
        assert_eq!(t.path, "/x?y=1");
        assert_eq!(t.authority, "[::1]:8080");
        let Ok(t) = target_of(&head("GET", "http://A.com/", &[])) else {
            panic!("parses")
        };
        assert_eq!((t.authority.as_str(), t.port), ("a.com", 80));
        assert!(target_of(&head("GET", "/relative", &[])).is_err());
        assert!(target_of(&head("GET", "https://a.com/", &[])).is_err());
        assert!(target_of(&head("CONNECT", "a.com", &[])).is_err());
    }

    #[test]
    fn the_forwarded_host_is_the_judged_one_not_the_clients() {
        let h = head(
            "GET",
            "http://allowed.example:8080/p",
            &[
                ("Host", "forbidden.example"),
                ("HOST", "also-forbidden.example"),
                ("Accept", "*/*"),
                ("Proxy-Authorization", "Basic x"),
            ],
        );
        let Ok(t) = target_of(&h) else {
            panic!("parses")
        };
        let out = String::from_utf8_lossy(&forward_head(&h, &t)).to_string();
        assert!(
            out.starts_with("GET /p HTTP/1.1\r\nHost: allowed.example:8080\r\n"),
            "{out}"
        );
        assert!(!out.contains("forbidden"), "{out}");
        assert!(out.contains("Accept: */*\r\n"), "{out}");
        assert!(!out.to_ascii_lowercase().contains("proxy-authorization"));
        assert!(out.ends_with("Connection: close\r\n\r\n"), "{out}");
        assert_eq!(out.matches("Host:").count(), 1, "{out}");
    }

    #[test]
    fn names_are_resolved_fully_qualified() {
        assert_eq!(fqdn("github.com"), "github.com.");
        assert_eq!(fqdn("github"), "github.");
        assert_eq!(fqdn("github.com."), "github.com.");
        assert_eq!(fqdn("10.0.0.1"), "10.0.0.1");
        assert_eq!(fqdn("::1"), "::1");
    }
}
