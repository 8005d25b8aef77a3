//! `stead token create|list|revoke` (#54): the tenant API's keys, written
//! to the configured database. A token's secret is printed once, by
//! `create`, and never stored.

use clap::{Subcommand, ValueEnum};
use serde::Serialize;
use stead::daemon::DaemonConfig;
use stead::ops::TokenRequest;
use stead::ports::{Token, TokenRole};

use crate::output::{say, say_json, CliError, EXIT_OK};

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Make a token for a team and print it, once: only its SHA-256 is
    /// kept. Give it to the team (or the portal acting for it) as
    /// `Authorization: Bearer <token>`.
    Create {
        /// The team whose instances the token sees and changes.
        #[arg(long)]
        team: String,
        /// tenant: its team's instances only; operator: the whole fleet
        /// and rollouts.
        #[arg(long, value_enum, default_value = "tenant")]
        role: RoleArg,
        /// How long the token lives: 30s, 10m, 2h, 90d; until revoked when
        /// absent.
        #[arg(long, value_name = "DURATION", value_parser = parse_expires)]
        expires: Option<std::time::Duration>,
        /// A note for `token list` (who has it, what for).
        #[arg(long, default_value = "")]
        label: String,
    },
    /// Every token (never a secret), revoked and expired ones too.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token: the API refuses it from now on. Safe to run twice.
    Revoke {
        /// The token's id (`stead token list`).
        id: i64,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum RoleArg {
    Tenant,
    Operator,
}

fn parse_expires(text: &str) -> Result<std::time::Duration, stead::daemon::event_log::SinceError> {
    stead::daemon::event_log::parse_since(text)
}

/// A token as `token list` shows it.
#[derive(Serialize)]
struct TokenView<'a> {
    id: i64,
    team: &'a str,
    role: &'static str,
    label: &'a str,
    created_at: String,
    expires_at: Option<String>,
    revoked_at: Option<String>,
}

impl<'a> From<&'a Token> for TokenView<'a> {
    fn from(token: &'a Token) -> Self {
        Self {
            id: token.id,
            team: &token.team,
            role: token.role.as_str(),
            label: &token.label,
            created_at: token.created_at.to_string(),
            expires_at: token.expires_at.map(|t| t.to_string()),
            revoked_at: token.revoked_at.map(|t| t.to_string()),
        }
    }
}

pub async fn token(config: &DaemonConfig, command: TokenCommand) -> Result<u8, CliError> {
    // Tokens name no service type: the catalog is not read.
    let store = stead::daemon::open_store(config).await?;
    let ops = crate::commands::operator(store.as_ref(), Default::default());
    match command {
        TokenCommand::Create {
            team,
            role,
            expires,
            label,
        } => {
            let role = match role {
                RoleArg::Tenant => TokenRole::Tenant,
                RoleArg::Operator => TokenRole::Operator,
            };
            let request = TokenRequest {
                team,
                role,
                expires_in: expires,
                label,
            };
            let (token, secret) = ops.create_token(&request).await?;
            crate::output::complain(&format!(
                "token {} ({} of team {}) created; it is shown once, below",
                token.id,
                token.role.as_str(),
                token.team
            ));
            say(secret);
        }
        TokenCommand::List { json } => {
            let tokens = ops.tokens().await?;
            let views: Vec<TokenView> = tokens.iter().map(TokenView::from).collect();
            if json {
                say_json(&views)?;
            } else {
                say(render(&views));
            }
        }
        TokenCommand::Revoke { id } => {
            if ops.revoke_token(id).await? {
                say(format!("token {id} revoked"));
            } else {
                say(format!("token {id} was already revoked; nothing changed"));
            }
        }
    }
    Ok(EXIT_OK)
}

fn render(views: &[TokenView]) -> String {
    let mut out = String::from("ID  TEAM  ROLE  LABEL  CREATED  EXPIRES  REVOKED");
    for v in views {
        out.push_str(&format!(
            "\n{}  {}  {}  {}  {}  {}  {}",
            v.id,
            v.team,
            v.role,
            if v.label.is_empty() { "-" } else { v.label },
            v.created_at,
            v.expires_at.as_deref().unwrap_or("never"),
            v.revoked_at.as_deref().unwrap_or("-"),
        ));
    }
    out
}
