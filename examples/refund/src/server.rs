//! A listener with a fixed pool of connection workers that stops completely on drop.
//!
//! Trials start and stop thousands of these, so every thread is joined and every open connection is shut down on
//! stop: nothing outlives its owner (tiny_http's detached pool threads linger for seconds after a drop, which at
//! this rate means hundreds of live threads, hence this small loop instead).

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// State shared by the accept loop, the workers and the owner.
#[derive(Default)]
pub(crate) struct Shared {
    stopping: AtomicBool,
    conns: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    next: u64,
    open: HashMap<u64, TcpStream>,
}

/// Keeps a connection registered for shutdown-on-stop while it is being served.
pub(crate) struct Tracked<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        self.shared.registry().open.remove(&self.id);
    }
}

impl Shared {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        // A panicking handler must not wedge shutdown: the map stays usable.
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the owner is stopping; long waits poll this.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Registers a socket so that stopping unblocks whoever is reading or writing it.
    pub fn track(&self, stream: &TcpStream) -> Tracked<'_> {
        let mut reg = self.registry();
        let id = reg.next;
        reg.next += 1;
        // Checked under the lock that stop() takes, so a socket is either shut down here or by stop().
        if self.stopping() {
            let _ = stream.shutdown(Shutdown::Both);
        } else if let Ok(clone) = stream.try_clone() {
            reg.open.insert(id, clone);
        }
        Tracked { shared: self, id }
    }
}

/// Accept loop plus workers; see the module doc.
pub(crate) struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
}

impl Server {
    /// Serves `listener`, one worker thread per handler; each handler gets whole connections.
    pub fn start<H>(listener: TcpListener, name: &str, handlers: Vec<H>) -> io::Result<Server>
    where
        H: FnMut(TcpStream, &Shared) + Send + 'static,
    {
        let addr = listener.local_addr()?;
        let (tx, rx) = mpsc::channel::<TcpStream>();
        let rx = Arc::new(Mutex::new(rx));
        let mut server = Server {
            addr,
            shared: Arc::default(),
            accept: None,
            workers: Vec::new(),
        };
        for (i, mut handler) in handlers.into_iter().enumerate() {
            let (rx, shared) = (rx.clone(), server.shared.clone());
            let spawned = thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                loop {
                    let next = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
                    // The accept loop dropping its sender is the signal to exit.
                    let Ok(stream) = next else { break };
                    // One bad request must not shrink a pool this small.
                    let _ = catch_unwind(AssertUnwindSafe(|| handler(stream, &shared)));
                }
            });
            match spawned {
                Ok(handle) => server.workers.push(handle),
                Err(e) => {
                    drop(tx);
                    return Err(e);
                }
            }
        }
        let shared = server.shared.clone();
        let accept = thread::Builder::new().name(format!("{name}-accept")).spawn(move || {
            for conn in listener.incoming() {
                if shared.stopping() {
                    break;
                }
                match conn {
                    Ok(stream) => {
                        if tx.send(stream).is_err() {
                            break;
                        }
                    }
                    // Aborted handshakes and fd exhaustion pass; back off so the latter does not spin.
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        })?;
        server.accept = Some(accept);
        Ok(server)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, shuts down open connections and joins every thread; idempotent.
    pub fn stop(&mut self) {
        {
            let reg = self.shared.registry();
            self.shared.stopping.store(true, Ordering::SeqCst);
            for stream in reg.open.values() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        if let Some(accept) = self.accept.take() {
            // A blocking accept() only returns on a connection, so make one.
            let woke = (0..50).any(|attempt| {
                if attempt > 0 {
                    thread::sleep(Duration::from_millis(10));
                }
                TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok()
            });
            // Out of fds for half a second: leaving the threads behind beats hanging the owner's drop (the workers
            // only exit once the accept loop has dropped its sender).
            if !woke {
                self.workers.clear();
                return;
            }
            let _ = accept.join();
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}
