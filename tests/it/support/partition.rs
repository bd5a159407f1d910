//! A network partition between one operator process and the test bed's apiserver: a loopback
//! TCP proxy in front of the apiserver, and a kubeconfig that points at it (the apiserver's
//! certificate names 127.0.0.1, whatever the port). [`ApiserverProxy::cut`] stops relaying in
//! both directions without closing anything, as a partition that drops the packets does: the
//! open connections go silent (requests sent, no answer), new ones are accepted and never
//! answered. No error ever reaches the process; only its own clocks can tell.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{apiserver_url, kubeconfig_path, rand_u32};

/// A proxy in front of the apiserver; relays until [`ApiserverProxy::cut`].
pub struct ApiserverProxy {
    /// Its port on 127.0.0.1.
    pub port: u16,
    cut: Arc<AtomicBool>,
    kubeconfig: PathBuf,
}

impl ApiserverProxy {
    /// Starts relaying to the apiserver of the bed's kubeconfig, and writes a copy of that
    /// kubeconfig that goes through the proxy.
    pub async fn start() -> ApiserverProxy {
        let admin = std::fs::read_to_string(kubeconfig_path()).expect("the bed's kubeconfig");
        let server = apiserver_url();
        let upstream = server
            .strip_prefix("https://")
            .expect("an https apiserver")
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let kubeconfig =
            std::env::temp_dir().join(format!("partition-{:08x}.kubeconfig", rand_u32()));
        std::fs::write(
            &kubeconfig,
            admin.replace(&server, &format!("https://127.0.0.1:{port}")),
        )
        .expect("write the proxy's kubeconfig");
        let cut = Arc::new(AtomicBool::new(false));
        let cut_accepts = Arc::clone(&cut);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let cut = Arc::clone(&cut_accepts);
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if cut.load(Ordering::SeqCst) {
                        return park(client, None).await;
                    }
                    match TcpStream::connect(&upstream).await {
                        Ok(server) => relay(client, server, cut).await,
                        Err(_) => drop(client),
                    }
                });
            }
        });
        ApiserverProxy {
            port,
            cut,
            kubeconfig,
        }
    }

    /// The kubeconfig that goes through this proxy.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The partition: nothing is relayed any more, nothing is closed.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

impl Drop for ApiserverProxy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// Holds the sockets open, silent, for as long as the test's runtime lives.
async fn park(client: TcpStream, server: Option<TcpStream>) {
    let _held = (client, server);
    futures::future::pending::<()>().await;
}

/// Relays one connection both ways until either side closes; once cut, both directions stop
/// (the bytes read are dropped) and the sockets are held open.
async fn relay(client: TcpStream, server: TcpStream, cut: Arc<AtomicBool>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let cut_up = Arc::clone(&cut);
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if cut_up.load(Ordering::SeqCst) {
                let _held = (client_rx, server_tx);
                return futures::future::pending::<()>().await;
            }
            if server_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if cut.load(Ordering::SeqCst) {
                let _held = (server_rx, client_tx);
                return futures::future::pending::<()>().await;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Either side closing ends the connection (the other half is dropped with it).
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
