//! What a rank publishes in the store about itself: a TCP endpoint that
//! works from anywhere, the identity of its machine, and (on Linux) a Unix
//! socket name that works from the same machine.
//!
//! Text format, one field per line: `tcp HOST:PORT`, and optionally
//! `machine BOOT_ID` and `unix NAME`.

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PeerAddress {
    pub(crate) tcp: String,
    /// Kernel boot id of the rank's machine, where known.
    pub(crate) machine: Option<String>,
    /// Abstract Unix socket name of the rank's listener.
    pub(crate) unix: Option<String>,
}

impl PeerAddress {
    pub(crate) fn encode(&self) -> String {
        let mut out = format!("tcp {}\n", self.tcp);
        if let Some(m) = &self.machine {
            out.push_str(&format!("machine {m}\n"));
        }
        if let Some(u) = &self.unix {
            out.push_str(&format!("unix {u}\n"));
        }
        out
    }

    pub(crate) fn decode(text: &str) -> Option<PeerAddress> {
        let mut address = PeerAddress {
            tcp: String::new(),
            machine: None,
            unix: None,
        };
        for line in text.lines() {
            let (key, value) = line.split_once(' ')?;
            if value.is_empty() || value.contains(' ') {
                return None;
            }
            match key {
                "tcp" => address.tcp = value.to_string(),
                "machine" => address.machine = Some(value.to_string()),
                "unix" => address.unix = Some(value.to_string()),
                _ => return None,
            }
        }
        (!address.tcp.is_empty()).then_some(address)
    }

    /// Whether `other` runs on the same machine as this rank.
    pub(crate) fn same_machine(&self, other: &PeerAddress) -> bool {
        self.machine.is_some() && self.machine == other.machine
    }
}

/// Identifies the running kernel: equal on two ranks iff they run on the
/// same (virtual) machine since its last boot.
#[cfg(target_os = "linux")]
pub(crate) fn machine_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty() && !id.contains(char::is_whitespace)).then(|| id.to_string())
}

/// Elsewhere ranks cannot tell whether they share a machine.
#[cfg(not(target_os = "linux"))]
pub(crate) fn machine_id() -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        let full = PeerAddress {
            tcp: "10.0.0.2:4567".into(),
            machine: Some("9be938dc-966a".into()),
            unix: Some("comm-ring/12/1/77".into()),
        };
        assert_eq!(PeerAddress::decode(&full.encode()), Some(full));
        let tcp_only = PeerAddress {
            tcp: "[::1]:80".into(),
            machine: None,
            unix: None,
        };
        assert_eq!(PeerAddress::decode(&tcp_only.encode()), Some(tcp_only));
    }

    #[test]
    fn text_without_a_tcp_endpoint_or_with_unknown_fields_is_rejected() {
        assert_eq!(PeerAddress::decode("unix n\n"), None);
        assert_eq!(PeerAddress::decode("10.0.0.2:4567"), None);
        assert_eq!(PeerAddress::decode("tcp a:1\ncolour blue\n"), None);
    }

    #[test]
    fn unknown_machines_are_never_the_same() {
        let a = PeerAddress::decode("tcp a:1\n").unwrap();
        assert!(!a.same_machine(&a.clone()));
        let b = PeerAddress::decode("tcp a:1\nmachine m\n").unwrap();
        assert!(b.same_machine(&PeerAddress::decode("tcp b:2\nmachine m\n").unwrap()));
    }
}
