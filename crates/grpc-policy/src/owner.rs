//! Which layer owns retries on a channel.

use std::fmt;
use std::str::FromStr;

/// The one layer that retries calls on a channel. Retries at several layers multiply (three
/// attempts at three layers is 27 requests for one call), so exactly one layer may own them.
/// `None` is a decision, not an omission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GrpcRetryOwner {
    /// An in-process executor in the application retries; the service config carries no
    /// retryPolicy or hedgingPolicy.
    Application,
    /// The gRPC channel retries, driven by the service config's retryPolicy and retryThrottling.
    Channel,
    /// A service mesh retries; nothing in the process may.
    Mesh,
    /// Nobody retries.
    None,
}

impl GrpcRetryOwner {
    /// Whether an in-process executor may retry under this owner.
    pub fn allows_in_process_retry(self) -> bool {
        matches!(self, Self::Application | Self::Channel)
    }

    /// Whether the service config may carry `retryPolicy` or `hedgingPolicy` under this owner.
    pub fn allows_service_config_retry(self) -> bool {
        matches!(self, Self::Channel)
    }
}

impl fmt::Display for GrpcRetryOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Application => "application",
            Self::Channel => "channel",
            Self::Mesh => "mesh",
            Self::None => "none",
        })
    }
}

impl FromStr for GrpcRetryOwner {
    type Err = UnknownOwner;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "application" => Ok(Self::Application),
            "channel" => Ok(Self::Channel),
            "mesh" => Ok(Self::Mesh),
            "none" => Ok(Self::None),
            _ => Err(UnknownOwner),
        }
    }
}

/// A retry owner name that is not one of `application`, `channel`, `mesh`, `none`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("retry owner must be one of application, channel, mesh, none")]
pub struct UnknownOwner;

#[cfg(test)]
mod tests {
    use super::GrpcRetryOwner::{self, *};

    #[test]
    fn owner_table_matches_the_design() {
        let table: [(GrpcRetryOwner, bool, bool); 4] = [
            (Application, true, false),
            (Channel, true, true),
            (Mesh, false, false),
            (None, false, false),
        ];
        for (owner, in_process, service_config) in table {
            assert_eq!(owner.allows_in_process_retry(), in_process, "{owner}");
            assert_eq!(
                owner.allows_service_config_retry(),
                service_config,
                "{owner}"
            );
        }
    }
}
