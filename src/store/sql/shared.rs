//! The [`Store`](crate::ports::Store) implementation both SQL backends share.
//!
//! The two backends speak the same statements ([`super::statements`])
//! through the same calls; they differ in how they connect, open write
//! transactions and check the fence (each backend file's own helpers
//! `write_transaction`, `fenced_transaction`, `write`, `insert_task` and
//! `write_lease`), and in two statements: the claim and the read of the
//! lease row that acquiring and releasing lock. A macro rather than a
//! generic impl, because sqlx's executor and argument types differ per
//! database in ways a generic bound would have to spell out at every call.
//! The expansion resolves names at the call site, so each backend file
//! imports what the body uses.

/// Appends one event through `$executor` (the pool, or a transaction of
/// the change the event records): the statement, its bindings and the
/// error mapping, once for every call site.
macro_rules! insert_event {
    ($executor:expr, $event:expr) => {{
        let event: &crate::core::event_log::Event = $event;
        sqlx::query(crate::store::sql::statements::INSERT_EVENT)
            .bind(crate::store::timestamp_to_us(event.at))
            .bind(event.kind.as_str())
            .bind(event.instance.as_ref().map(|i| i.as_str()))
            .bind(event.service.as_ref().map(|s| s.as_str()))
            .bind(event.container.as_ref().map(|c| c.as_str()))
            .bind(&event.reason)
            .bind(&event.message)
            .bind(event.until.map(crate::store::timestamp_to_us))
            .bind(event.trace_id.as_deref())
            .bind(event.task)
            .bind(&event.writer)
            .execute($executor)
            .await
            .map_err(crate::store::sql::db_error)
    }};
}

/// `impl Store for $store`, with the backend's claim statement and its
/// lease-row lock.
macro_rules! impl_sql_store {
    ($store:ty, claim: $claim:expr, lock_lease: $lock_lease:expr) => {
        #[async_trait::async_trait]
        impl Store for $store {
            #[tracing::instrument(name = "store.create_instance", level = "debug", skip_all)]
            async fn create_instance(
                &self,
                new: &NewInstance,
                now: Timestamp,
            ) -> Result<Instance, StoreError> {
                let mut tx = self.write_transaction().await?;
                let created = super::tenancy::insert_instance!(tx, new, now);
                tx.commit().await.map_err(db_error)?;
                Ok(created)
            }

            #[tracing::instrument(name = "store.instance", level = "debug", skip_all)]
            async fn instance(&self, name: &InstanceName) -> Result<Option<Instance>, StoreError> {
                sqlx::query_as::<_, InstanceRow>(sql::INSTANCE_BY_NAME)
                    .bind(name.as_str())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_error)?
                    .map(InstanceRow::decode)
                    .transpose()
            }

            #[tracing::instrument(name = "store.instance_by_id", level = "debug", skip_all)]
            async fn instance_by_id(&self, id: InstanceId) -> Result<Option<Instance>, StoreError> {
                sqlx::query_as::<_, InstanceRow>(sql::INSTANCE_BY_ID)
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_error)?
                    .map(InstanceRow::decode)
                    .transpose()
            }

            #[tracing::instrument(name = "store.list_instances", level = "debug", skip_all)]
            async fn list_instances(&self) -> Result<Rows<Instance>, StoreError> {
                crate::store::sql::timed("list_instances", self.call_timeout, async {
                    let rows = self.instance_rows().await?;
                    Ok(collect_rows(rows.into_iter().map(|row| {
                        row.map_err(|(_, e)| e).and_then(InstanceRow::decode)
                    })))
                })
                .await
            }

            #[tracing::instrument(name = "store.live_service_types", level = "debug", skip_all)]
            async fn live_service_types(
                &self,
            ) -> Result<std::collections::BTreeSet<String>, StoreError> {
                crate::store::sql::timed("live_service_types", self.call_timeout, async {
                    let types: Vec<String> = sqlx::query_scalar(sql::LIVE_SERVICE_TYPES)
                        .bind(InstanceState::Deleted.as_str())
                        .fetch_all(&self.pool)
                        .await
                        .map_err(db_error)?;
                    Ok(types.into_iter().collect())
                })
                .await
            }

            #[tracing::instrument(name = "store.list_for_recovery", level = "debug", skip_all)]
            async fn list_for_recovery(&self) -> Result<Rows<ListedInstance>, StoreError> {
                crate::store::sql::timed("list_for_recovery", self.call_timeout, async {
                    let rows = self.listed_rows().await?;
                    Ok(collect_rows(rows.into_iter().map(|row| {
                        row.map_err(|(_, e)| e).and_then(ListedRow::decode)
                    })))
                })
                .await
            }

            #[tracing::instrument(name = "store.set_instance_state", level = "debug", skip_all)]
            async fn set_instance_state(
                &self,
                id: InstanceId,
                from: InstanceState,
                to: InstanceState,
                now: Timestamp,
            ) -> Result<bool, StoreError> {
                let write = LockedWrite::State { id, from, to, now };
                self.instance_write(write, super::shared::Fence::Lease(None))
                    .await
            }

            #[tracing::instrument(name = "store.set_instance_stopped", level = "debug", skip_all)]
            async fn set_instance_stopped(
                &self,
                id: InstanceId,
                stopped: bool,
                now: Timestamp,
            ) -> Result<(), StoreError> {
                let found = self
                    .write(
                        sqlx::query(sql::SET_INSTANCE_STOPPED)
                            .bind(id)
                            .bind(stopped)
                            .bind(timestamp_to_us(now)),
                    )
                    .await?;
                found_or(found, id)
            }

            #[tracing::instrument(
                name = "store.set_instance_spec_digest",
                level = "debug",
                skip_all
            )]
            async fn set_instance_spec_digest(
                &self,
                id: InstanceId,
                digest: &str,
                now: Timestamp,
            ) -> Result<(), StoreError> {
                let write = LockedWrite::SpecDigest { id, digest, now };
                self.instance_write(write, super::shared::Fence::Lease(None))
                    .await
                    .map(drop)
            }

            #[tracing::instrument(name = "store.set_purge_volumes", level = "debug", skip_all)]
            async fn set_purge_volumes(
                &self,
                id: InstanceId,
                now: Timestamp,
            ) -> Result<(), StoreError> {
                let found = self
                    .write(
                        sqlx::query(sql::SET_INSTANCE_PURGE_VOLUMES)
                            .bind(id)
                            .bind(timestamp_to_us(now)),
                    )
                    .await?;
                found_or(found, id)
            }

            #[tracing::instrument(name = "store.set_instance_version", level = "debug", skip_all)]
            async fn set_instance_version(
                &self,
                id: InstanceId,
                version: &str,
                now: Timestamp,
            ) -> Result<(), StoreError> {
                let write = LockedWrite::Version { id, version, now };
                self.instance_write(write, super::shared::Fence::Lease(None))
                    .await
                    .map(drop)
            }

            #[tracing::instrument(name = "store.load_active", level = "debug", skip_all)]
            async fn load_active(
                &self,
                instance: &InstanceName,
            ) -> Result<ActiveRecord, StoreError> {
                let rows = sqlx::query_as::<_, ActiveRow>(sql::LOAD_ACTIVE)
                    .bind(instance.as_str())
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_error)?;
                let services = rows
                    .into_iter()
                    .map(ActiveRow::decode)
                    .collect::<Result<_, _>>()?;
                Ok(ActiveRecord { services })
            }

            #[tracing::instrument(name = "store.save_active_service", level = "debug", skip_all)]
            async fn save_active_service(
                &self,
                instance: &InstanceName,
                service: &ServiceName,
                active: &ActiveService,
            ) -> Result<(), StoreError> {
                let write = LockedWrite::SaveActive {
                    instance,
                    service,
                    active,
                };
                self.instance_write(write, super::shared::Fence::Lease(None))
                    .await
                    .map(drop)
            }

            #[tracing::instrument(name = "store.remove_active_service", level = "debug", skip_all)]
            async fn remove_active_service(
                &self,
                instance: &InstanceName,
                service: &ServiceName,
            ) -> Result<(), StoreError> {
                let write = LockedWrite::RemoveActive { instance, service };
                self.instance_write(write, super::shared::Fence::Lease(None))
                    .await
                    .map(drop)
            }

            #[tracing::instrument(name = "store.persist_binds", level = "debug", skip_all)]
            async fn persist_binds(
                &self,
                instance: &InstanceName,
                service: &ServiceName,
                container: &ContainerId,
                revision: &str,
                binds: &Binds,
                fence: Option<&LeaseGrant>,
            ) -> Result<bool, StoreError> {
                self.write_fenced(
                    sqlx::query(sql::PERSIST_BINDS)
                        .bind(instance.as_str())
                        .bind(service.as_str())
                        .bind(container.as_str())
                        .bind(revision)
                        .bind(encode_binds(binds)),
                    fence,
                )
                .await
            }

            #[tracing::instrument(
                name = "store.record_verified_execution",
                level = "debug",
                skip_all
            )]
            async fn record_verified_execution(
                &self,
                instance: &InstanceName,
                service: &ServiceName,
                container: &ContainerId,
                started_at: Timestamp,
                fence: Option<&LeaseGrant>,
            ) -> Result<(), StoreError> {
                self.write_fenced(
                    sqlx::query(sql::RECORD_VERIFIED)
                        .bind(instance.as_str())
                        .bind(service.as_str())
                        .bind(container.as_str())
                        .bind(execution_start_to_ns(started_at)),
                    fence,
                )
                .await
                .map(drop)
            }

            #[tracing::instrument(name = "store.release_claims", level = "debug", skip_all)]
            async fn release_claims(
                &self,
                instance: &InstanceName,
                container: &ContainerId,
                fence: Option<&LeaseGrant>,
            ) -> Result<(), StoreError> {
                let write = LockedWrite::ReleaseClaims {
                    instance,
                    container,
                };
                self.instance_write(write, super::shared::Fence::Lease(fence))
                    .await
                    .map(drop)
            }

            #[tracing::instrument(name = "store.load_instances", level = "debug", skip_all)]
            async fn load_instances(
                &self,
                ids: &[InstanceId],
            ) -> Result<LoadedInstances, StoreError> {
                crate::store::sql::timed("load_instances", self.call_timeout, async {
                    if ids.is_empty() {
                        return Ok(LoadedInstances::default());
                    }
                    let (instances, active, inhibitions) = self.load_batch(ids).await?;
                    Ok(assemble_loaded(instances, active, inhibitions))
                })
                .await
            }

            #[tracing::instrument(name = "store.load_inhibitions", level = "debug", skip_all)]
            async fn load_inhibitions(
                &self,
                instance: &InstanceName,
            ) -> Result<Vec<Inhibition>, StoreError> {
                let rows = sqlx::query_as::<_, InhibitionRow>(sql::LOAD_INHIBITIONS)
                    .bind(instance.as_str())
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_error)?;
                let mut inhibitions = rows
                    .into_iter()
                    .map(InhibitionRow::decode)
                    .collect::<Result<Vec<_>, _>>()?;
                inhibition_order(&mut inhibitions);
                Ok(inhibitions)
            }

            #[tracing::instrument(name = "store.ways_back", level = "debug", skip_all)]
            async fn ways_back(
                &self,
                now: Timestamp,
            ) -> Result<crate::ports::WaysBack, StoreError> {
                let rows = sqlx::query_as::<_, InhibitionRow>(sql::WAYS_BACK)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_error)?;
                let mut ways = crate::ports::WaysBack::default();
                for row in rows {
                    let id = row.instance_id;
                    let Ok(marker) = row.decode() else {
                        continue;
                    };
                    if marker.bakes_at(now).is_some() {
                        ways.baking.insert(id);
                    }
                    if marker.revert_to.is_some_and(|back| back.undone) {
                        ways.undone.insert(id);
                    }
                }
                Ok(ways)
            }

            #[tracing::instrument(name = "store.save_inhibition", level = "debug", skip_all)]
            async fn save_inhibition(
                &self,
                instance: &InstanceName,
                inhibition: &Inhibition,
            ) -> Result<(), StoreError> {
                let write = LockedWrite::SaveInhibition {
                    instance,
                    inhibition,
                };
                self.instance_write(write, super::shared::Fence::Lease(None))
                    .await
                    .map(drop)
            }

            #[tracing::instrument(name = "store.clear_inhibition", level = "debug", skip_all)]
            async fn clear_inhibition(
                &self,
                instance: &InstanceName,
                service: &ServiceName,
                container: &ContainerId,
                fence: Option<&LeaseGrant>,
            ) -> Result<(), StoreError> {
                let write = LockedWrite::ClearInhibition {
                    instance,
                    service,
                    container,
                };
                self.instance_write(write, super::shared::Fence::Lease(fence))
                    .await
                    .map(drop)
            }

            async fn write_under_lock(
                &self,
                lock: &LockGrant,
                write: LockedWrite<'_>,
            ) -> Result<bool, StoreError> {
                self.instance_write(write, super::shared::Fence::Lock(lock))
                    .await
            }

            #[tracing::instrument(name = "store.write_under_lease", level = "debug", skip_all)]
            async fn write_under_lease(
                &self,
                lease: &LeaseGrant,
                write: LockedWrite<'_>,
            ) -> Result<bool, StoreError> {
                self.instance_write(write, super::shared::Fence::Lease(Some(lease)))
                    .await
            }

            #[tracing::instrument(name = "store.enqueue", level = "debug", skip_all)]
            async fn enqueue(
                &self,
                task: &NewTask,
                now: Timestamp,
                fence: Option<&LeaseGrant>,
            ) -> Result<Option<TaskId>, StoreError> {
                // Unfenced, the insert is one statement and atomic on its own.
                if fence.is_none() {
                    return insert_task(&self.pool, task, now).await;
                }
                let mut tx = self.fenced_transaction(fence).await?;
                let id = insert_task(&mut *tx, task, now).await?;
                tx.commit().await.map_err(db_error)?;
                Ok(id)
            }

            #[tracing::instrument(name = "store.claim", level = "debug", skip_all)]
            async fn claim(
                &self,
                worker: &str,
                now: Timestamp,
                limit: u32,
            ) -> Result<Vec<Task>, StoreError> {
                let rows = sqlx::query_as::<_, TaskRow>($claim)
                    .bind(worker)
                    .bind(timestamp_to_us(now))
                    .bind(i64::from(limit))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_error)?;
                // The claim filtered on known kinds and states, so every row decodes.
                let mut tasks = rows
                    .into_iter()
                    .map(TaskRow::decode)
                    .collect::<Result<Vec<_>, _>>()?;
                claim_order(&mut tasks);
                Ok(tasks)
            }

            #[tracing::instrument(name = "store.extend_lease", level = "debug", skip_all)]
            async fn extend_lease(
                &self,
                id: TaskId,
                worker: &str,
                now: Timestamp,
            ) -> Result<bool, StoreError> {
                self.write(
                    sqlx::query(sql::EXTEND_LEASE)
                        .bind(id)
                        .bind(worker)
                        .bind(timestamp_to_us(now)),
                )
                .await
            }

            #[tracing::instrument(name = "store.complete", level = "debug", skip_all)]
            async fn complete(
                &self,
                id: TaskId,
                worker: &str,
                now: Timestamp,
            ) -> Result<bool, StoreError> {
                self.write(
                    sqlx::query(sql::COMPLETE)
                        .bind(id)
                        .bind(worker)
                        .bind(timestamp_to_us(now)),
                )
                .await
            }

            #[tracing::instrument(name = "store.retry", level = "debug", skip_all)]
            async fn retry(
                &self,
                id: TaskId,
                worker: &str,
                run_after: Timestamp,
                error: &str,
                now: Timestamp,
            ) -> Result<bool, StoreError> {
                self.write(
                    sqlx::query(sql::RETRY)
                        .bind(id)
                        .bind(worker)
                        .bind(timestamp_to_us(run_after))
                        .bind(error)
                        .bind(timestamp_to_us(now)),
                )
                .await
            }

            #[tracing::instrument(name = "store.fail", level = "debug", skip_all)]
            async fn fail(
                &self,
                id: TaskId,
                worker: &str,
                error: &str,
                now: Timestamp,
            ) -> Result<bool, StoreError> {
                self.write(
                    sqlx::query(sql::FAIL)
                        .bind(id)
                        .bind(worker)
                        .bind(error)
                        .bind(timestamp_to_us(now)),
                )
                .await
            }

            #[tracing::instrument(name = "store.reset_expired_leases", level = "debug", skip_all)]
            async fn reset_expired_leases(
                &self,
                now: Timestamp,
                lease: Duration,
                fence: Option<&LeaseGrant>,
            ) -> Result<u64, StoreError> {
                let now_us = timestamp_to_us(now);
                let reset = sqlx::query(sql::RESET_EXPIRED)
                    .bind(now_us)
                    .bind(lease_cutoff_us(now_us, lease_to_us(lease)));
                // Unfenced, the update is one statement and atomic on its own.
                if fence.is_none() {
                    let done = reset.execute(&self.pool).await.map_err(db_error)?;
                    return Ok(done.rows_affected());
                }
                let mut tx = self.fenced_transaction(fence).await?;
                let done = reset.execute(&mut *tx).await.map_err(db_error)?;
                tx.commit().await.map_err(db_error)?;
                Ok(done.rows_affected())
            }

            #[tracing::instrument(name = "store.active_tasks", level = "debug", skip_all)]
            async fn active_tasks(&self) -> Result<Rows<Task>, StoreError> {
                crate::store::sql::timed("active_tasks", self.call_timeout, async {
                    let rows = sqlx::query_as::<_, TaskRow>(sql::ACTIVE_TASKS)
                        .fetch_all(&self.pool)
                        .await
                        .map_err(db_error)?;
                    Ok(collect_rows(rows.into_iter().map(TaskRow::decode)))
                })
                .await
            }

            #[tracing::instrument(name = "store.task", level = "debug", skip_all)]
            async fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
                sqlx::query_as::<_, TaskRow>(sql::TASK_BY_ID)
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db_error)?
                    .map(TaskRow::decode)
                    .transpose()
            }

            #[tracing::instrument(name = "store.expire_instance", level = "debug", skip_all)]
            async fn expire_instance(
                &self,
                id: InstanceId,
                from: InstanceState,
                task: &NewTask,
                now: Timestamp,
                fence: Option<&LeaseGrant>,
            ) -> Result<Option<Expired>, StoreError> {
                self.expire_in_transaction(id, from, task, now, fence, super::shared::Expiry::Plain)
                    .await
            }

            #[tracing::instrument(
                name = "store.expire_instance_purging",
                level = "debug",
                skip_all
            )]
            async fn expire_instance_purging(
                &self,
                id: InstanceId,
                from: InstanceState,
                task: &NewTask,
                now: Timestamp,
            ) -> Result<Option<Expired>, StoreError> {
                self.expire_in_transaction(
                    id,
                    from,
                    task,
                    now,
                    None,
                    super::shared::Expiry::Purging,
                )
                .await
            }

            #[tracing::instrument(name = "store.tasks", level = "debug", skip_all)]
            async fn tasks(
                &self,
                include_finished: bool,
                limit: u32,
            ) -> Result<Rows<Task>, StoreError> {
                crate::store::sql::timed("tasks", self.call_timeout, async {
                    let rows = sqlx::query_as::<_, TaskRow>(sql::LIST_TASKS)
                        .bind(include_finished)
                        .bind(i64::from(limit))
                        .fetch_all(&self.pool)
                        .await
                        .map_err(db_error)?;
                    Ok(collect_rows(rows.into_iter().map(TaskRow::decode)))
                })
                .await
            }

            #[tracing::instrument(name = "store.queue_depth", level = "debug", skip_all)]
            async fn queue_depth(&self) -> Result<u64, StoreError> {
                crate::store::sql::timed("queue_depth", self.call_timeout, async {
                    let n: i64 = sqlx::query_scalar(sql::QUEUE_DEPTH)
                        .fetch_one(&self.pool)
                        .await
                        .map_err(db_error)?;
                    Ok(u64::try_from(n).unwrap_or(0))
                })
                .await
            }

            #[tracing::instrument(name = "store.instance_counts", level = "debug", skip_all)]
            async fn instance_counts(&self) -> Result<BTreeMap<InstanceState, u64>, StoreError> {
                crate::store::sql::timed("instance_counts", self.call_timeout, async {
                    let rows: Vec<(String, i64)> = sqlx::query_as(sql::INSTANCE_COUNTS)
                        .fetch_all(&self.pool)
                        .await
                        .map_err(db_error)?;
                    Ok(count_states(rows))
                })
                .await
            }

            #[tracing::instrument(name = "store.rollouts", level = "debug", skip_all)]
            async fn rollouts(&self) -> Result<BTreeMap<String, RolloutState>, StoreError> {
                crate::store::sql::timed("rollouts", self.call_timeout, async {
                    let rows: Vec<(String, String)> = sqlx::query_as(sql::ROLLOUTS)
                        .fetch_all(&self.pool)
                        .await
                        .map_err(db_error)?;
                    rows.into_iter()
                        .map(|(service_type, state)| decode_rollout(service_type, state))
                        .collect()
                })
                .await
            }

            #[tracing::instrument(name = "store.rollout_records", level = "debug", skip_all)]
            async fn rollout_records(&self) -> Result<Vec<RolloutRecord>, StoreError> {
                crate::store::sql::timed("rollout_records", self.call_timeout, async {
                    let rows: Vec<(String, String, String, i64, Option<String>)> =
                        sqlx::query_as(sql::ROLLOUT_RECORDS)
                            .fetch_all(&self.pool)
                            .await
                            .map_err(db_error)?;
                    rows.into_iter().map(decode_rollout_record).collect()
                })
                .await
            }

            #[tracing::instrument(name = "store.set_rollout", level = "debug", skip_all)]
            async fn set_rollout(
                &self,
                service_type: &str,
                state: RolloutState,
                reason: &str,
                now: Timestamp,
                fence: Option<&LeaseGrant>,
            ) -> Result<(), StoreError> {
                self.write_fenced(
                    sqlx::query(sql::SET_ROLLOUT)
                        .bind(service_type)
                        .bind(state.as_str())
                        .bind(reason)
                        .bind(timestamp_to_us(now)),
                    fence,
                )
                .await
                .map(drop)
            }

            #[tracing::instrument(name = "store.pin_rollout", level = "debug", skip_all)]
            async fn pin_rollout(
                &self,
                service_type: &str,
                version: &str,
                reason: &str,
                now: Timestamp,
            ) -> Result<(), StoreError> {
                crate::store::sql::timed("pin_rollout", self.call_timeout, async {
                    self.write(
                        sqlx::query(sql::PIN_ROLLOUT)
                            .bind(service_type)
                            .bind(version)
                            .bind(reason)
                            .bind(timestamp_to_us(now)),
                    )
                    .await
                    .map(drop)
                })
                .await
            }

            #[tracing::instrument(name = "store.record_type_version", level = "debug", skip_all)]
            async fn record_type_version(
                &self,
                recorded: &TypeVersion,
                fence: Option<&LeaseGrant>,
            ) -> Result<bool, StoreError> {
                crate::store::sql::timed("record_type_version", self.call_timeout, async {
                    let mut tx = self.fenced_transaction(fence).await?;
                    let done = sqlx::query(sql::RECORD_TYPE_VERSION)
                        .bind(&recorded.service_type)
                        .bind(&recorded.version)
                        .bind(&recorded.spec_digest)
                        .bind(&recorded.source)
                        .bind(timestamp_to_us(recorded.recorded_at))
                        .execute(&mut *tx)
                        .await
                        .map_err(db_error)?;
                    tx.commit().await.map_err(db_error)?;
                    Ok(done.rows_affected() == 1)
                })
                .await
            }

            #[tracing::instrument(name = "store.type_versions", level = "debug", skip_all)]
            async fn type_versions(
                &self,
                service_type: &str,
            ) -> Result<Vec<TypeVersion>, StoreError> {
                crate::store::sql::timed("type_versions", self.call_timeout, async {
                    let rows: Vec<(String, String, String, String, i64)> =
                        sqlx::query_as(sql::TYPE_VERSIONS)
                            .bind(service_type)
                            .fetch_all(&self.pool)
                            .await
                            .map_err(db_error)?;
                    rows.into_iter().map(decode_type_version).collect()
                })
                .await
            }

            #[tracing::instrument(name = "store.reserve_hosts", level = "debug", skip_all)]
            async fn reserve_hosts(
                &self,
                instance: &InstanceName,
                service: &ServiceName,
                hosts: &[String],
                now: Timestamp,
                fence: Option<&LeaseGrant>,
            ) -> Result<Vec<crate::core::hosts::HostReservation>, StoreError> {
                crate::store::sql::hosts::reserve_hosts!(self, instance, service, hosts, now, fence)
            }

            #[tracing::instrument(name = "store.host_reservations", level = "debug", skip_all)]
            async fn host_reservations(
                &self,
            ) -> Result<Vec<crate::core::hosts::HostReservation>, StoreError> {
                crate::store::sql::hosts::host_reservations!(self)
            }

            #[tracing::instrument(name = "store.database_now", level = "debug", skip_all)]
            async fn database_now(&self) -> Result<Timestamp, StoreError> {
                crate::store::sql::timed("database_now", self.call_timeout, async {
                    let us = sqlx::query_scalar::<_, i64>(SELECT_DB_NOW)
                        .fetch_one(&self.pool)
                        .await
                        .map_err(db_error)?;
                    timestamp_from_us(us).ok_or_else(|| {
                        StoreError::Unavailable(format!("the database's clock reads {us} µs"))
                    })
                })
                .await
            }

            #[tracing::instrument(
                name = "store.acquire_reconciler_lease",
                level = "debug",
                skip_all
            )]
            async fn acquire_reconciler_lease(
                &self,
                holder: &str,
                ttl: Duration,
            ) -> Result<Option<LeaseGrant>, StoreError> {
                crate::store::sql::timed("acquire_reconciler_lease", self.call_timeout, async {
                    let mut tx = self.write_transaction().await?;
                    let (current, now_us) = sqlx::query_as::<_, LeaseRow>($lock_lease)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db_error)?
                        .decode();
                    let Some(next) = current.acquire(holder, now_us, lease_to_us(ttl)) else {
                        return Ok(None);
                    };
                    write_lease(&mut tx, &next).await?;
                    tx.commit().await.map_err(db_error)?;
                    lease_grant(&next).map(Some)
                })
                .await
            }

            #[tracing::instrument(
                name = "store.release_reconciler_lease",
                level = "debug",
                skip_all
            )]
            async fn release_reconciler_lease(&self, grant: &LeaseGrant) -> Result<(), StoreError> {
                crate::store::sql::timed("release_reconciler_lease", self.call_timeout, async {
                    let mut tx = self.write_transaction().await?;
                    let (current, _) = sqlx::query_as::<_, LeaseRow>($lock_lease)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db_error)?
                        .decode();
                    write_lease(&mut tx, &current.release(grant)).await?;
                    tx.commit().await.map_err(db_error)
                })
                .await
            }

            #[tracing::instrument(name = "store.try_lock_instances", level = "debug", skip_all)]
            async fn try_lock_instances(
                &self,
                instances: &[InstanceId],
                holder: &str,
                ttl: Duration,
            ) -> Result<Vec<InstanceId>, StoreError> {
                if instances.is_empty() {
                    return Ok(Vec::new());
                }
                sqlx::query_scalar::<_, i64>(TRY_LOCK_INSTANCES)
                    .bind(id_list(instances))
                    .bind(holder)
                    .bind(lease_to_us(ttl))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_error)
            }

            #[tracing::instrument(name = "store.try_lock_and_load", level = "debug", skip_all)]
            async fn try_lock_and_load(
                &self,
                instances: &[InstanceId],
                holder: &str,
                ttl: Duration,
            ) -> Result<(Vec<InstanceId>, Result<LoadedInstances, StoreError>), StoreError> {
                crate::store::sql::timed("try_lock_and_load", self.call_timeout, async {
                    if instances.is_empty() {
                        return Ok((Vec::new(), Ok(LoadedInstances::default())));
                    }
                    let (locked, rows) = self.lock_and_load_batch(instances, holder, ttl).await?;
                    let loaded = rows.map(|(instances, active, inhibitions)| {
                        assemble_loaded(instances, active, inhibitions)
                    });
                    Ok((locked, loaded))
                })
                .await
            }

            #[tracing::instrument(name = "store.unlock_instances", level = "debug", skip_all)]
            async fn unlock_instances(
                &self,
                instances: &[InstanceId],
                holder: &str,
            ) -> Result<(), StoreError> {
                if instances.is_empty() {
                    return Ok(());
                }
                self.write(
                    sqlx::query(UNLOCK_INSTANCES)
                        .bind(id_list(instances))
                        .bind(holder),
                )
                .await
                .map(drop)
            }

            #[tracing::instrument(
                name = "store.clear_instance_locks_of",
                level = "debug",
                skip_all
            )]
            async fn clear_instance_locks_of(&self, prefix: &str) -> Result<u64, StoreError> {
                sqlx::query(sql::CLEAR_INSTANCE_LOCKS_OF)
                    .bind(prefix)
                    .execute(&self.pool)
                    .await
                    .map(|done| done.rows_affected())
                    .map_err(db_error)
            }

            #[tracing::instrument(name = "store.cancel_queued_task", level = "debug", skip_all)]
            async fn cancel_queued_task(
                &self,
                id: TaskId,
                reason: &str,
                now: Timestamp,
            ) -> Result<bool, StoreError> {
                sqlx::query(sql::CANCEL_QUEUED_TASK)
                    .bind(id)
                    .bind(reason)
                    .bind(timestamp_to_us(now))
                    .execute(&self.pool)
                    .await
                    .map(|done| done.rows_affected() == 1)
                    .map_err(db_error)
            }

            #[tracing::instrument(name = "store.cancel_queued_upgrades", level = "debug", skip_all)]
            async fn cancel_queued_upgrades(
                &self,
                service_type: &str,
                reason: &str,
                now: Timestamp,
            ) -> Result<Vec<TaskId>, StoreError> {
                let mut ids: Vec<TaskId> = sqlx::query_scalar(sql::CANCEL_QUEUED_UPGRADES)
                    .bind(service_type)
                    .bind(reason)
                    .bind(timestamp_to_us(now))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_error)?;
                ids.sort_unstable();
                Ok(ids)
            }

            #[tracing::instrument(name = "store.requeue_tasks_of", level = "debug", skip_all)]
            async fn requeue_tasks_of(
                &self,
                prefix: &str,
                now: Timestamp,
            ) -> Result<Vec<TaskId>, StoreError> {
                let mut ids: Vec<TaskId> = sqlx::query_scalar(sql::REQUEUE_TASKS_OF)
                    .bind(prefix)
                    .bind(timestamp_to_us(now))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db_error)?;
                ids.sort_unstable();
                Ok(ids)
            }

            #[tracing::instrument(name = "store.reconciler_lease", level = "debug", skip_all)]
            async fn reconciler_lease(&self) -> Result<Option<LeaseGrant>, StoreError> {
                crate::store::sql::timed("reconciler_lease", self.call_timeout, async {
                    let (row, _) = sqlx::query_as::<_, LeaseRow>($lock_lease)
                        .fetch_one(&self.pool)
                        .await
                        .map_err(db_error)?
                        .decode();
                    Ok(row.grant())
                })
                .await
            }

            #[tracing::instrument(name = "store.append_events", level = "debug", skip_all)]
            async fn append_events(
                &self,
                events: &[crate::core::event_log::Event],
            ) -> Result<(), StoreError> {
                use crate::store::sql::db_error as event_db_error;
                if events.is_empty() {
                    return Ok(());
                }
                crate::store::sql::timed("append_events", self.call_timeout, async {
                    let mut tx = self.write_transaction().await?;
                    for event in events {
                        super::shared::insert_event!(&mut *tx, event)?;
                    }
                    tx.commit().await.map_err(event_db_error)
                })
                .await
            }

            #[tracing::instrument(name = "store.enqueue_recorded", level = "debug", skip_all)]
            async fn enqueue_recorded(
                &self,
                task: &NewTask,
                now: Timestamp,
                fence: Option<&LeaseGrant>,
                event: &crate::core::event_log::Event,
            ) -> Result<Option<TaskId>, StoreError> {
                let mut tx = self.fenced_transaction(fence).await?;
                let Some(id) = insert_task(&mut *tx, task, now).await? else {
                    return Ok(None); // Nothing queued, nothing to record.
                };
                super::shared::insert_event!(&mut *tx, &event.clone().task(id))?;
                tx.commit().await.map_err(db_error)?;
                Ok(Some(id))
            }

            #[tracing::instrument(name = "store.finish_task_recorded", level = "debug", skip_all)]
            async fn finish_task_recorded(
                &self,
                id: TaskId,
                worker: &str,
                finish: crate::ports::TaskFinish<'_>,
                now: Timestamp,
                event: &crate::core::event_log::Event,
            ) -> Result<bool, StoreError> {
                use crate::ports::TaskFinish;
                let mut tx = self.write_transaction().await?;
                let query = match finish {
                    TaskFinish::Done => sqlx::query(sql::COMPLETE)
                        .bind(id)
                        .bind(worker)
                        .bind(timestamp_to_us(now)),
                    TaskFinish::Retry { run_after, error } => sqlx::query(sql::RETRY)
                        .bind(id)
                        .bind(worker)
                        .bind(timestamp_to_us(run_after))
                        .bind(error)
                        .bind(timestamp_to_us(now)),
                    TaskFinish::Fail { error } => sqlx::query(sql::FAIL)
                        .bind(id)
                        .bind(worker)
                        .bind(error)
                        .bind(timestamp_to_us(now)),
                };
                let held = query
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?
                    .rows_affected()
                    > 0;
                if !held {
                    return Ok(false); // Not this worker's any more: nothing to record.
                }
                super::shared::insert_event!(&mut *tx, &event.clone().task(id))?;
                tx.commit().await.map_err(db_error)?;
                Ok(true)
            }

            #[tracing::instrument(
                name = "store.expire_instance_recorded",
                level = "debug",
                skip_all
            )]
            async fn expire_instance_recorded(
                &self,
                id: InstanceId,
                from: InstanceState,
                task: &NewTask,
                now: Timestamp,
                fence: Option<&LeaseGrant>,
                event: &crate::core::event_log::Event,
            ) -> Result<Option<Expired>, StoreError> {
                self.expire_in_transaction(
                    id,
                    from,
                    task,
                    now,
                    fence,
                    super::shared::Expiry::Recorded(event),
                )
                .await
            }

            #[tracing::instrument(name = "store.events", level = "debug", skip_all)]
            async fn events(
                &self,
                filter: &crate::core::event_log::EventFilter,
            ) -> Result<Rows<crate::core::event_log::LoggedEvent>, StoreError> {
                use crate::store::sql::rows::EventRow;
                use crate::store::sql::{db_error as event_db_error, statements as event_sql};
                let statement = if filter.after_id.is_some() {
                    event_sql::OLDEST_EVENTS
                } else {
                    event_sql::NEWEST_EVENTS
                };
                crate::store::sql::timed("events", self.call_timeout, async {
                    let mut rows = sqlx::query_as::<_, EventRow>(statement)
                        .bind(filter.instance.as_ref().map(|i| i.as_str()))
                        .bind(filter.kind.map(|k| k.as_str()))
                        .bind(filter.since.map_or(i64::MIN, crate::store::timestamp_to_us))
                        .bind(filter.after_id.unwrap_or(i64::MIN))
                        .bind(i64::from(filter.limit))
                        .bind(filter.team.as_deref())
                        .fetch_all(&self.pool)
                        .await
                        .map_err(event_db_error)?;
                    rows.sort_unstable_by_key(|row| row.id);
                    Ok(crate::store::sql::rows::collect_rows(
                        rows.into_iter().map(EventRow::decode),
                    ))
                })
                .await
            }

            #[tracing::instrument(name = "store.webhook_cursor", level = "debug", skip_all)]
            async fn webhook_cursor(&self, webhook: &str) -> Result<Option<i64>, StoreError> {
                use crate::store::sql::{db_error as cursor_db_error, statements as cursor_sql};
                crate::store::sql::timed("webhook_cursor", self.call_timeout, async {
                    sqlx::query_scalar::<_, i64>(cursor_sql::WEBHOOK_CURSOR)
                        .bind(webhook)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(cursor_db_error)
                })
                .await
            }

            #[tracing::instrument(name = "store.advance_webhook_cursor", level = "debug", skip_all)]
            async fn advance_webhook_cursor(
                &self,
                webhook: &str,
                from: Option<i64>,
                to: i64,
                now: Timestamp,
            ) -> Result<bool, StoreError> {
                use crate::store::sql::{db_error as cursor_db_error, statements as cursor_sql};
                let query = match from {
                    None => sqlx::query(cursor_sql::INSERT_WEBHOOK_CURSOR)
                        .bind(webhook)
                        .bind(to)
                        .bind(timestamp_to_us(now)),
                    Some(from) => sqlx::query(cursor_sql::ADVANCE_WEBHOOK_CURSOR)
                        .bind(webhook)
                        .bind(from)
                        .bind(to)
                        .bind(timestamp_to_us(now)),
                };
                crate::store::sql::timed("advance_webhook_cursor", self.call_timeout, async {
                    query
                        .execute(&self.pool)
                        .await
                        .map(|done| done.rows_affected() > 0)
                        .map_err(cursor_db_error)
                })
                .await
            }

            #[tracing::instrument(name = "store.prune_events", level = "debug", skip_all)]
            async fn prune_events(
                &self,
                before: Timestamp,
                batch_max: u32,
            ) -> Result<u64, StoreError> {
                use crate::store::sql::{db_error as event_db_error, statements as event_sql};
                crate::store::sql::timed("prune_events", self.call_timeout, async {
                    sqlx::query(event_sql::PRUNE_EVENTS)
                        .bind(crate::store::timestamp_to_us(before))
                        .bind(i64::from(batch_max))
                        .execute(&self.pool)
                        .await
                        .map(|done| done.rows_affected())
                        .map_err(event_db_error)
                })
                .await
            }

            #[tracing::instrument(name = "store.prune_finished_tasks", level = "debug", skip_all)]
            #[tracing::instrument(name = "store.prune_type_versions", level = "debug", skip_all)]
            async fn prune_type_versions(&self, before: Timestamp) -> Result<u64, StoreError> {
                crate::store::sql::timed("prune_type_versions", self.call_timeout, async {
                    sqlx::query(sql::PRUNE_TYPE_VERSIONS)
                        .bind(timestamp_to_us(before))
                        .execute(&self.pool)
                        .await
                        .map(|done| done.rows_affected())
                        .map_err(db_error)
                })
                .await
            }

            async fn prune_finished_tasks(
                &self,
                before: Timestamp,
                batch_max: u32,
            ) -> Result<u64, StoreError> {
                crate::store::sql::timed("prune_finished_tasks", self.call_timeout, async {
                    sqlx::query(sql::PRUNE_FINISHED_TASKS)
                        .bind(timestamp_to_us(before))
                        .bind(i64::from(batch_max))
                        .execute(&self.pool)
                        .await
                        .map(|done| done.rows_affected())
                        .map_err(db_error)
                })
                .await
            }
        }

        impl $store {
            /// One write to an instance ([`LockedWrite`]), answered as its
            /// store method answers: unfenced or under the reconciler lease
            /// (T2), or under the instance's lock (T3,
            /// [`Store::write_under_lock`]).
            async fn instance_write(
                &self,
                write: LockedWrite<'_>,
                fence: super::shared::Fence<'_>,
            ) -> Result<bool, StoreError> {
                let statement = match write {
                    LockedWrite::State { id, from, to, now } => {
                        sqlx::query(sql::SET_INSTANCE_STATE)
                            .bind(id)
                            .bind(from.as_str())
                            .bind(to.as_str())
                            .bind(timestamp_to_us(now))
                    }
                    LockedWrite::Version { id, version, now } => {
                        sqlx::query(sql::SET_INSTANCE_VERSION)
                            .bind(id)
                            .bind(version)
                            .bind(timestamp_to_us(now))
                    }
                    LockedWrite::SpecDigest { id, digest, now } => {
                        sqlx::query(sql::SET_INSTANCE_SPEC_DIGEST)
                            .bind(id)
                            .bind(digest)
                            .bind(timestamp_to_us(now))
                    }
                    LockedWrite::SaveActive {
                        instance,
                        service,
                        active,
                    } => sqlx::query(sql::SAVE_ACTIVE)
                        .bind(instance.as_str())
                        .bind(service.as_str())
                        .bind(active.container.as_str())
                        .bind(&active.effective_revision)
                        .bind(encode_binds(&active.binds))
                        .bind(encode_grace(active.stop_grace))
                        .bind(active.verified_started_at.and_then(execution_start_to_ns)),
                    LockedWrite::RemoveActive { instance, service } => {
                        sqlx::query(sql::REMOVE_ACTIVE)
                            .bind(instance.as_str())
                            .bind(service.as_str())
                    }
                    LockedWrite::ReleaseClaims {
                        instance,
                        container,
                    } => sqlx::query(sql::RELEASE_CLAIMS)
                        .bind(instance.as_str())
                        .bind(container.as_str()),
                    LockedWrite::SaveInhibition {
                        instance,
                        inhibition,
                    } => sqlx::query(sql::SAVE_INHIBITION)
                        .bind(instance.as_str())
                        .bind(inhibition.service.as_str())
                        .bind(inhibition.container.as_str())
                        .bind(inhibition.reason.as_str())
                        .bind(&inhibition.operation)
                        .bind(timestamp_to_us(inhibition.created_at))
                        .bind(encode_grace(inhibition.stop_grace))
                        .bind(encode_revert_to(inhibition.revert_to.as_ref())),
                    LockedWrite::ClearInhibition {
                        instance,
                        service,
                        container,
                    } => sqlx::query(sql::CLEAR_INHIBITION)
                        .bind(instance.as_str())
                        .bind(service.as_str())
                        .bind(container.as_str()),
                };
                let changed = match fence {
                    super::shared::Fence::Lease(grant) => {
                        self.write_fenced(statement, grant).await?
                    }
                    super::shared::Fence::Lock(lock) => self.write_locked(statement, lock).await?,
                };
                match write {
                    LockedWrite::State { .. } => Ok(changed),
                    LockedWrite::Version { id, .. } | LockedWrite::SpecDigest { id, .. } => {
                        found_or(changed, id).map(|()| true)
                    }
                    LockedWrite::SaveActive { instance, .. }
                    | LockedWrite::SaveInhibition { instance, .. } => {
                        instance_found_or(changed, instance).map(|()| true)
                    }
                    LockedWrite::RemoveActive { .. }
                    | LockedWrite::ReleaseClaims { .. }
                    | LockedWrite::ClearInhibition { .. } => Ok(true),
                }
            }

            /// TTL expiry or deletion (`Store::expire_instance`), with its
            /// event, if any, written in the same transaction (#42).
            #[tracing::instrument(name = "store.expire_in_transaction", level = "debug", skip_all)]
            async fn expire_in_transaction(
                &self,
                id: InstanceId,
                from: InstanceState,
                task: &NewTask,
                now: Timestamp,
                fence: Option<&LeaseGrant>,
                expiry: super::shared::Expiry<'_>,
            ) -> Result<Option<Expired>, StoreError> {
                let mut tx = self.fenced_transaction(fence).await?;
                let changed = sqlx::query(sql::EXPIRE_INSTANCE)
                    .bind(id)
                    .bind(from.as_str())
                    .bind(timestamp_to_us(now))
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?
                    .rows_affected();
                if changed == 0 {
                    return Ok(None); // Dropping the transaction rolls it back.
                }
                let Some(task_id) = insert_task(&mut *tx, task, now).await? else {
                    // A deprovision is already active: undo the state change too, so
                    // the call is all or nothing.
                    return Ok(None);
                };
                if let super::shared::Expiry::Purging = expiry {
                    sqlx::query(sql::SET_INSTANCE_PURGE_VOLUMES)
                        .bind(id)
                        .bind(timestamp_to_us(now))
                        .execute(&mut *tx)
                        .await
                        .map_err(db_error)?;
                }
                let mut cancelled: Vec<TaskId> =
                    sqlx::query_scalar(sql::CANCEL_QUEUED_FOR_DELETION)
                        .bind(id)
                        .bind(timestamp_to_us(now))
                        .bind(CANCELLED_BY_DELETION)
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(db_error)?;
                if let super::shared::Expiry::Recorded(event) = expiry {
                    super::shared::insert_event!(&mut *tx, &event.clone().task(task_id))?;
                }
                tx.commit().await.map_err(db_error)?;
                // `RETURNING` promises no order.
                cancelled.sort_unstable();
                Ok(Some(Expired {
                    task: task_id,
                    cancelled,
                }))
            }
        }
    };
}

pub(super) use impl_sql_store;

/// What an expiry writes besides the state, the task and the cancels.
pub(super) enum Expiry<'a> {
    Plain,
    /// Its event, naming the task (#42).
    Recorded(&'a crate::core::event_log::Event),
    /// The purge flag (`instance delete --purge-volumes`, #41).
    Purging,
}
pub(super) use insert_event;

/// What guards a write to an instance: the reconciler lease, if given
/// (T2), or the instance's lock (T3).
pub(super) enum Fence<'a> {
    Lease(Option<&'a crate::ports::LeaseGrant>),
    Lock(&'a crate::ports::LockGrant),
}
