//! `stead plan` and `stead reload --plan` (#55): what reloading the
//! catalog file would do, asked of the running daemon (which reads the
//! file, judges its hazards and forecasts the rollout with its planners);
//! nothing changes. Exit status 1 when a reload would be refused.

use stead::daemon::plan::PlanAnswer;
use stead::daemon::DaemonConfig;

use crate::commands::{admin_client, admin_url, refuse_unauthorized, ADMIN_TIMEOUT};
use crate::output::{say, say_json, CliError, EXIT_FAILURE, EXIT_OK};

pub(crate) async fn plan(config: &DaemonConfig, json: bool) -> Result<u8, CliError> {
    let url = admin_url(config)?;
    let endpoint = format!("{url}/plan");
    let response = admin_client(config, ADMIN_TIMEOUT)?
        .get(&endpoint)
        .send()
        .await
        .map_err(|e| format!("no daemon answered on {url} ({e}); is `stead run` running?"))?;
    refuse_unauthorized(&response, &endpoint)?;
    if !response.status().is_success() {
        let code = response.status();
        let why = response.text().await.unwrap_or_default();
        return Err(format!("{endpoint}: {code}: {}", why.trim_end()).into());
    }
    let answer: PlanAnswer = response
        .json()
        .await
        .map_err(|e| format!("{endpoint}: unexpected answer: {e}"))?;
    if json {
        say_json(&answer)?;
    } else {
        say(answer.text().trim_end());
    }
    Ok(if answer.refused() {
        EXIT_FAILURE
    } else {
        EXIT_OK
    })
}
