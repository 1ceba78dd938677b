//! What a rank publishes in the store about its data listeners: a TCP
//! endpoint that works from anywhere and, on Linux, a Unix socket name that
//! works from the same machine.
//!
//! Text format, one field per line: `tcp HOST:PORT` and optionally
//! `unix MACHINE_ID NAME`.

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerAddress {
    pub(crate) tcp: String,
    pub(crate) unix: Option<UnixEndpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnixEndpoint {
    /// Kernel boot id of the rank's machine.
    pub(crate) machine: String,
    /// Abstract socket name.
    pub(crate) name: String,
}

impl PeerAddress {
    pub(crate) fn encode(&self) -> String {
        let mut out = format!("tcp {}\n", self.tcp);
        if let Some(u) = &self.unix {
            out.push_str(&format!("unix {} {}\n", u.machine, u.name));
        }
        out
    }

    pub(crate) fn decode(text: &str) -> Option<PeerAddress> {
        let mut tcp = None;
        let mut unix = None;
        for line in text.lines() {
            let mut fields = line.split(' ');
            match (fields.next(), fields.next(), fields.next(), fields.next()) {
                (Some("tcp"), Some(addr), None, None) => tcp = Some(addr.to_string()),
                (Some("unix"), Some(machine), Some(name), None) => {
                    unix = Some(UnixEndpoint {
                        machine: machine.to_string(),
                        name: name.to_string(),
                    });
                }
                _ => return None,
            }
        }
        Some(PeerAddress { tcp: tcp?, unix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        let both = PeerAddress {
            tcp: "10.0.0.2:4567".into(),
            unix: Some(UnixEndpoint {
                machine: "9be938dc-966a".into(),
                name: "comm-ring/12/1/77".into(),
            }),
        };
        assert_eq!(PeerAddress::decode(&both.encode()), Some(both));
        let tcp_only = PeerAddress {
            tcp: "[::1]:80".into(),
            unix: None,
        };
        assert_eq!(PeerAddress::decode(&tcp_only.encode()), Some(tcp_only));
    }

    #[test]
    fn text_without_a_tcp_endpoint_is_rejected() {
        assert_eq!(PeerAddress::decode("unix m n\n"), None);
        assert_eq!(PeerAddress::decode("10.0.0.2:4567"), None);
    }
}
