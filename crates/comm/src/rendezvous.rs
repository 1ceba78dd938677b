//! Joining a job: rank 0 hosts the store (or a launcher does, see
//! [`StoreHost`]), every rank (rank 0 included) registers with it as a
//! client.

use std::net::{IpAddr, Ipv6Addr};

use crate::config::{CommConfig, StoreHost};
use crate::error::CommError;
use crate::store::Store;
use crate::store_server::StoreServer;

/// Membership in a job: a registered store connection and, on rank 0, the
/// store itself, which lives exactly as long as this value.
///
/// Transports build on it: the TCP ring publishes its listen addresses here,
/// a NCCL transport will publish its unique id.
#[derive(Debug)]
pub struct Rendezvous {
    config: CommConfig,
    store: Store,
    // Declared after `store` so rank 0 disconnects its own client before the
    // server shuts down.
    server: Option<StoreServer>,
}

impl Rendezvous {
    /// Validates `config`, starts the store on rank 0 (unless the launcher
    /// hosts it), and registers this rank. Fails with
    /// [`CommError::PortInUse`] when rank 0 cannot bind `MASTER_PORT`, and
    /// with a [`crate::Rejection`] when this rank's `WORLD_SIZE` or rank
    /// conflicts with the job.
    pub fn join(config: &CommConfig) -> Result<Self, CommError> {
        config.validate()?;
        let server = match (config.rank, &config.store) {
            (0, StoreHost::RankZero) => Some(StoreServer::bind_with_auth(
                &config.master_addr,
                config.master_port,
                config.world_size,
                config.timeout,
                config.auth.token().cloned(),
            )?),
            _ => None,
        };
        let store = Store::connect(config)?;
        Ok(Rendezvous {
            config: config.clone(),
            store,
            server,
        })
    }

    pub fn config(&self) -> &CommConfig {
        &self.config
    }

    /// The store, to publish and look up values shared by all ranks.
    pub fn store(&mut self) -> &mut Store {
        &mut self.store
    }

    /// The host under which other ranks can reach a listener of this
    /// process. Ranks other than 0 use the local address of their store
    /// connection (the interface that routes to rank 0), which works across
    /// machines without configuration. Rank 0, and any rank that reached the
    /// store over loopback (so runs on rank 0's machine), uses `MASTER_ADDR`
    /// itself: everyone already reaches that host under that name.
    pub fn advertised_host(&self) -> Result<String, CommError> {
        let local = self.store.local_addr()?.ip();
        if self.server.is_some() || local.is_loopback() {
            Ok(self.config.master_addr.clone())
        } else {
            Ok(host_text(local))
        }
    }
}

/// `ip` in the form `host:port` strings expect (IPv6 in brackets).
fn host_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => format!("[{v6}]"),
        },
    }
}

/// Joins `host` and `port`, bracketing bare IPv6 literals.
pub(crate) fn endpoint(host: &str, port: u16) -> String {
    if host.parse::<Ipv6Addr>().is_ok() {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_bracket_ipv6_only() {
        assert_eq!(endpoint("node01", 80), "node01:80");
        assert_eq!(endpoint("10.0.0.2", 80), "10.0.0.2:80");
        assert_eq!(endpoint("::1", 80), "[::1]:80");
        assert_eq!(endpoint("[::1]", 80), "[::1]:80");
    }

    #[test]
    fn mapped_ipv4_is_written_as_ipv4() {
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(host_text(mapped), "10.1.2.3");
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(host_text(v6), "[fe80::1]");
    }
}
