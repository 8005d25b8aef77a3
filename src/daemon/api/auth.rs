//! Who is asking: `Authorization: Bearer <token>` checked against the
//! store's hashes ([`Ops::authenticate`]), then held to the token's rate
//! (GCRA from `governor`, keyed by token id: the keys are bounded by the
//! tokens that exist, never by what a client sends). Requests without a
//! live token are refused before any work; a limited one is told when to
//! come back.

use std::num::NonZeroU32;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::{DefaultKeyedRateLimiter, Quota};

use super::problem::Problem;
use super::ApiState;
use crate::ops::Scope;
use crate::ports::{Token, TokenRole};

/// The caller of a request that passed [`authenticate`].
#[derive(Clone, Debug)]
pub struct Caller {
    pub token_id: i64,
    pub team: String,
    pub role: TokenRole,
}

impl Caller {
    /// What its commands see: its team's instances, or the fleet.
    pub fn scope(&self) -> Scope {
        match self.role {
            TokenRole::Operator => Scope::Fleet,
            TokenRole::Tenant => Scope::Team(self.team.clone()),
        }
    }

    /// The writer of the events its changes record.
    pub fn writer(&self) -> String {
        format!("api:token-{}@{}", self.token_id, self.team)
    }
}

impl From<Token> for Caller {
    fn from(token: Token) -> Self {
        Self {
            token_id: token.id,
            team: token.team,
            role: token.role,
        }
    }
}

/// Per-token request rate.
pub struct RateLimit(DefaultKeyedRateLimiter<i64>);

impl RateLimit {
    pub fn per_minute(requests: u32) -> Self {
        let requests = NonZeroU32::new(requests).unwrap_or(NonZeroU32::MIN);
        Self(DefaultKeyedRateLimiter::keyed(Quota::per_minute(requests)))
    }

    /// `Err` with the seconds to wait when `token` is over its rate.
    fn check(&self, token: i64) -> Result<(), u64> {
        use governor::clock::{Clock, DefaultClock};
        self.0.check_key(&token).map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            wait.as_secs().max(1)
        })
    }
}

/// The token a request presents, if it presents one.
fn bearer(request: &Request) -> Option<&str> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Admits a request with a live token within its rate, as a [`Caller`]
/// in its extensions; answers 401 or 429 otherwise.
pub async fn authenticate(
    State(state): State<ApiState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(presented) = bearer(&request) else {
        return Problem::unauthorized("an Authorization: Bearer <token> header is required")
            .into_response();
    };
    let ops = state.ops(crate::ops::Scope::Fleet);
    let token = match ops.authenticate(presented).await {
        Ok(Some(token)) => token,
        Ok(None) => {
            return Problem::unauthorized(
                "the bearer token is not a live stead token (unknown, revoked or expired)",
            )
            .into_response()
        }
        Err(e) => return Problem::from_ops(e).into_response(),
    };
    if let Err(wait_s) = state.rate_limit.check(token.id) {
        let mut response = Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            format!(
                "token {} made more than {} requests a minute; try again in {wait_s} s",
                token.id, state.settings.requests_per_minute
            ),
        )
        .into_response();
        if let Ok(value) = HeaderValue::from_str(&wait_s.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    request.extensions_mut().insert(Caller::from(token));
    next.run(request).await
}
