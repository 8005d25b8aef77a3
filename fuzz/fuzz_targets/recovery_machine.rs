//! `recovery_machine`: an arbitrary ACTIVE record, intent, inhibition and
//! memory (budget, verified execution, pending withdrawal), then an
//! arbitrary stream of outcomes, each answering whatever command the
//! machine yields next. `run_and_check` asserts the safety properties after
//! every step (see fuzz/src/machine.rs and docs/fuzzing.md); a violated
//! property, a panic or a command beyond the bound is a crash.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use stead_fuzz::machine::{run_and_check, CaseSeed, EntrySeed, OutcomeSeed};

/// Outcomes beyond this many are never consumed (the machine is bounded).
const OUTCOMES_MAX: usize = 32;

#[derive(Debug)]
struct Input {
    case: CaseSeed,
    outcomes: Vec<OutcomeSeed>,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let budget = if u.arbitrary()? {
            Some(EntrySeed {
                failures: u.arbitrary()?,
                next_attempt_s: u.arbitrary()?,
                stable_since_s: u.arbitrary()?,
                unhealthy_streak: u.arbitrary()?,
                attempt_pending: u.arbitrary()?,
            })
        } else {
            None
        };
        let case = CaseSeed {
            stopped: u.ratio(1, 10)?,
            inhibited: u.ratio(1, 10)?,
            active_binds: u.arbitrary()?,
            active_verified: u.arbitrary()?,
            memory_verified: u.arbitrary()?,
            withdrawal_pending: u.ratio(1, 5)?,
            budget,
            free_attempts: u.arbitrary()?,
            unhealthy_threshold: u.arbitrary()?,
            proxy: u.arbitrary()?,
        };
        let mut outcomes = Vec::new();
        while outcomes.len() < OUTCOMES_MAX && !u.is_empty() {
            outcomes.push(OutcomeSeed {
                choice: u.arbitrary()?,
                status: u.arbitrary()?,
                execution: u.arbitrary()?,
                health: u.arbitrary()?,
                binds: u.arbitrary()?,
                took_ms: u.arbitrary()?,
            });
        }
        Ok(Self { case, outcomes })
    }
}

fuzz_target!(|input: Input| {
    run_and_check(&input.case.build(), &input.outcomes);
});
