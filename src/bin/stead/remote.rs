//! `stead --server URL instance ...` (#54): the instance commands through
//! the tenant API instead of the database, so a tenant or an operator
//! needs a token and no database access. The server runs the very
//! commands the local CLI runs; this side only sends and prints.

use std::path::Path;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::output::{
    say, say_json, CliError, EXIT_CONFLICT, EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK,
    EXIT_UNAVAILABLE, EXIT_USAGE,
};
use crate::InstanceCommand;

/// Bound on one call to the API.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Most pages `instance list` follows (at 500 instances a page).
const PAGES_MAX: usize = 1000;
/// The environment variable holding the token when no file is given.
pub const TOKEN_ENV: &str = "STEAD_TOKEN";
/// Longest token file read.
const TOKEN_FILE_LEN_MAX: u64 = 4096;

/// A client of one server with one token.
pub struct Remote {
    base: String,
    token: String,
    client: reqwest::Client,
}

impl Remote {
    /// The token from `token_file`, else from `$STEAD_TOKEN`.
    pub fn new(server: &str, token_file: Option<&Path>) -> Result<Self, CliError> {
        let token = match token_file {
            Some(path) => read_token(path)?,
            None => std::env::var(TOKEN_ENV).map_err(|_| CliError {
                message: format!("--server needs a token: --token-file FILE or ${TOKEN_ENV}"),
                code: EXIT_USAGE,
            })?,
        };
        let client = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(|e| CliError::from(format!("cannot make an HTTP client: {e}")))?;
        Ok(Self {
            base: server.trim_end_matches('/').to_owned(),
            token: token.trim().to_owned(),
            client,
        })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        key: Option<&str>,
    ) -> Result<Value, CliError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.client.request(method, &url).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.map_err(|e| CliError {
            message: format!("{url}: {e}"),
            code: EXIT_UNAVAILABLE,
        })?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        let detail = body["detail"].as_str().unwrap_or("no detail");
        Err(CliError {
            message: format!("{url}: {status}: {detail}"),
            code: exit_code(status),
        })
    }
}

fn read_token(path: &Path) -> Result<String, CliError> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(TOKEN_FILE_LEN_MAX).read_to_string(&mut text))
        .map_err(|e| CliError::from(format!("--token-file {}: {e}", path.display())))?;
    Ok(text)
}

/// The local CLI's exit status for an API's answer.
fn exit_code(status: StatusCode) -> u8 {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY | StatusCode::FORBIDDEN => {
            EXIT_USAGE
        }
        StatusCode::NOT_FOUND => EXIT_NOT_FOUND,
        StatusCode::CONFLICT => EXIT_CONFLICT,
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => EXIT_UNAVAILABLE,
        _ => EXIT_FAILURE,
    }
}

/// One instance as a line.
fn line(instance: &Value) -> String {
    let s = |key: &str| instance[key].as_str().unwrap_or("-").to_owned();
    let intent = if instance["stopped"] == true {
        "stopped"
    } else {
        "running"
    };
    format!(
        "{}  {}  {}  {}  {}  {}",
        s("name"),
        s("team"),
        s("type"),
        s("version"),
        s("state"),
        intent
    )
}

fn refused(what: &str) -> CliError {
    CliError {
        message: format!("{what} is not available through --server; run it on the database"),
        code: EXIT_USAGE,
    }
}

/// Runs an instance command through the API.
pub async fn instance(remote: &Remote, command: InstanceCommand) -> Result<u8, CliError> {
    let path = |name: &str, action: &str| format!("/v1/instances/{name}{action}");
    let (answer, json) = match command {
        InstanceCommand::Create {
            name,
            service_type,
            ttl_s,
            window,
            exists_ok,
            parameters,
            domains,
            version,
            team: _,
        } => {
            if version.is_some() {
                return Err(refused("--version"));
            }
            let body = json!({
                "name": name,
                "type": service_type,
                "ttl_s": ttl_s,
                "maintenance_window": window,
                "parameters": parameters.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
                "domains": domains,
            });
            // The API's create with a key accepts a live instance of that
            // name and type, as --exists-ok does.
            let key = exists_ok.then(|| format!("exists-ok:{name}"));
            let created = remote
                .call(Method::POST, "/v1/instances", Some(body), key.as_deref())
                .await?;
            say(format!("created {}", line(&created)));
            if let Some(url) = created["urls"][0].as_str() {
                say(format!("served at {url}"));
            }
            return Ok(EXIT_OK);
        }
        InstanceCommand::List { all, json, team } => {
            return list(remote, all, json, team.as_deref()).await
        }
        InstanceCommand::Show { name, json } => {
            let detail = remote
                .call(Method::GET, &path(&name, ""), None, None)
                .await?;
            (detail, json)
        }
        InstanceCommand::Stop { name } => (post(remote, &path(&name, "/stop")).await?, false),
        InstanceCommand::Start { name } => (post(remote, &path(&name, "/start")).await?, false),
        InstanceCommand::Retry { name } => (post(remote, &path(&name, "/retry")).await?, false),
        InstanceCommand::Delete {
            name,
            purge_volumes,
        } => {
            let query = if purge_volumes {
                "?purge_volumes=true"
            } else {
                ""
            };
            let answer = remote
                .call(Method::DELETE, &path(&name, query), None, None)
                .await?;
            (answer, false)
        }
        InstanceCommand::Inhibit {
            name,
            service,
            reason,
        } => {
            let body = json!({"service": service, "reason": reason});
            let answer = remote
                .call(Method::POST, &path(&name, "/inhibit"), Some(body), None)
                .await?;
            (answer, false)
        }
        InstanceCommand::Release { name, service } => {
            let body = json!({"service": service});
            let answer = remote
                .call(Method::POST, &path(&name, "/release"), Some(body), None)
                .await?;
            (answer, false)
        }
        InstanceCommand::Why { .. } => return Err(refused("instance why")),
    };
    if json {
        say_json(&answer)?;
    } else if let Some(message) = answer["message"].as_str() {
        say(message);
    } else {
        say(line(&answer["instance"]));
        for url in answer["instance"]["urls"].as_array().into_iter().flatten() {
            say(format!("served at {}", url.as_str().unwrap_or("-")));
        }
        for event in answer["events"].as_array().into_iter().flatten() {
            let s = |key: &str| event[key].as_str().unwrap_or("-").to_owned();
            say(format!("{}  {}  {}", s("at"), s("kind"), s("message")));
        }
    }
    Ok(EXIT_OK)
}

async fn post(remote: &Remote, path: &str) -> Result<Value, CliError> {
    remote.call(Method::POST, path, None, None).await
}

/// Every page of the listing.
async fn list(remote: &Remote, all: bool, json: bool, team: Option<&str>) -> Result<u8, CliError> {
    let mut instances = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..PAGES_MAX {
        let mut query = format!("/v1/instances?limit=500&all={all}");
        if let Some(team) = team {
            query.push_str(&format!("&team={team}"));
        }
        if let Some(cursor) = &cursor {
            query.push_str(&format!("&cursor={cursor}"));
        }
        let page = remote.call(Method::GET, &query, None, None).await?;
        instances.extend(page["instances"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    if json {
        say_json(&instances)?;
    } else {
        for instance in &instances {
            say(line(instance));
        }
    }
    Ok(EXIT_OK)
}
