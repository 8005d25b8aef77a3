//! `planners`: an arbitrary small control-loop world (instances of a few
//! teams, service types, versions and window specs; their queued, running,
//! done and failed tasks; live releases, some foreign; rollout switches in
//! the store and the catalog; the fleet limit and lease) into the four
//! planners. The properties are the ones `tests/control_plan.rs` checks
//! with proptest, from the same code (`fuzz/src/planners.rs`): no second
//! active task of one kind per instance, never more upgrades in flight than
//! the limit, planning again after applying the plan decides nothing, and
//! every decision is well formed; and `stead plan`'s forecast agrees with
//! the planner it runs.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use stead_fuzz::planners::{
    check_forecast, check_idempotent, check_in_flight_limit, check_no_duplicate_active_tasks,
    check_plan_shape, InstanceSeed, WorldSeed, INSTANCES_MAX, RELEASES_MAX,
};

#[derive(Debug)]
struct Input(WorldSeed);

fn instance(u: &mut Unstructured<'_>) -> arbitrary::Result<InstanceSeed> {
    Ok(InstanceSeed {
        team: u.arbitrary()?,
        service_type: u.arbitrary()?,
        version: u.arbitrary()?,
        state: u.arbitrary()?,
        expires_s: u.arbitrary()?,
        window: u.arbitrary()?,
        tasks: u.arbitrary()?,
    })
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let now_min = u.arbitrary()?;
        let halted = (u.ratio(1, 6)?, u.ratio(1, 6)?);
        let catalog = u.arbitrary()?;
        let max_in_flight = u.arbitrary()?;
        let lease = u.arbitrary()?;
        let releases = if u.ratio(1, 8)? {
            None
        } else {
            let n = u.int_in_range(0..=RELEASES_MAX)?;
            Some(
                (0..n)
                    .map(|_| u.arbitrary())
                    .collect::<arbitrary::Result<_>>()?,
            )
        };
        let mut instances = Vec::new();
        while instances.len() < INSTANCES_MAX && !u.is_empty() {
            instances.push(instance(u)?);
        }
        Ok(Input(WorldSeed {
            now_min,
            instances,
            releases,
            halted,
            catalog,
            max_in_flight,
            lease,
        }))
    }
}

fuzz_target!(|input: Input| {
    let world = input.0.build();
    check_plan_shape(&world);
    check_no_duplicate_active_tasks(&world);
    check_in_flight_limit(&world);
    check_idempotent(&world);
    check_forecast(&world);
});
