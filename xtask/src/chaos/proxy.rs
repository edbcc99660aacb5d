//! A TCP forwarder on loopback whose target can be switched; switching cuts every forwarded
//! connection, as a failover cuts clients off the old primary. The chaos run's stand-in for a
//! load balancer in front of PostgreSQL's primary and standby, and of Galera's nodes.
//!
//! Not a fault itself (switching it is part of the failover injectors in [`super::faults`]), and
//! not for anything that needs to outlive xtask: its threads end with the process.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;

pub(crate) struct Proxy {
    port: u16,
    target: Arc<AtomicU16>,
    generation: Arc<AtomicU64>,
}

impl Proxy {
    pub(crate) fn start(target: u16) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let target = Arc::new(AtomicU16::new(target));
        let generation = Arc::new(AtomicU64::new(0));
        let (t, g) = (Arc::clone(&target), Arc::clone(&generation));
        // The accept thread lives until xtask exits; it holds only loopback sockets.
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (target, generation) = (t.load(Ordering::SeqCst), Arc::clone(&g));
                std::thread::spawn(move || forward(client, target, generation));
            }
        });
        Ok(Self {
            port,
            target,
            generation,
        })
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn switch_to(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

fn forward(client: TcpStream, target: u16, generation: Arc<AtomicU64>) {
    let born = generation.load(Ordering::SeqCst);
    let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let pump = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let mut buffer = [0u8; 16 * 1024];
            while let Ok(n) = from.read(&mut buffer) {
                if n == 0 || to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        })
    };
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let up = pump(c2, s2);
    let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let down = pump(s3, c3);
    while !up.is_finished() || !down.is_finished() {
        if generation.load(Ordering::SeqCst) != born {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
