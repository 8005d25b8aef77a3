//! Public host names reserved for an instance (#54), in both SQL backends:
//! the statements and the bodies of the two [`Store`](crate::ports::Store)
//! calls, which `impl_sql_store!` takes in.
//!
//! A claim is one upsert per host that writes only when nobody holds the
//! host or its holder is a deleted instance, then a read of who holds it:
//! both in one (fenced) write transaction, so the answer is the claim's.

/// Reserves host `$1` for instance `$2` (if live) and its service `$3`
/// at `$4`, unless a live instance holds it already.
pub const RESERVE_HOST: &str = "INSERT INTO host_reservations \
     (host, instance_id, service, created_at_us) \
     SELECT $1, id, $3, $4 FROM instances WHERE name = $2 AND state <> 'deleted' \
     ON CONFLICT (host) DO UPDATE SET instance_id = excluded.instance_id, \
     service = excluded.service, created_at_us = excluded.created_at_us \
     WHERE EXISTS (SELECT 1 FROM instances AS holder \
     WHERE holder.id = host_reservations.instance_id AND holder.state = 'deleted')";

/// The live holder of host `$1`, if any.
pub const HOST_HOLDER: &str = "SELECT r.host, i.name, r.service, r.created_at_us \
     FROM host_reservations AS r JOIN instances AS i ON i.id = r.instance_id \
     WHERE r.host = $1 AND i.state <> 'deleted'";

/// Every reservation of a live instance, by host.
pub const HOST_RESERVATIONS: &str = "SELECT r.host, i.name, r.service, r.created_at_us \
     FROM host_reservations AS r JOIN instances AS i ON i.id = r.instance_id \
     WHERE i.state <> 'deleted' ORDER BY r.host";

/// The body of `Store::reserve_hosts` for a backend with
/// `fenced_transaction` and `call_timeout` (both have them): an
/// expression, so `impl_sql_store!` keeps the method itself where
/// `async_trait` sees it.
macro_rules! reserve_hosts {
    ($store:expr, $instance:expr, $service:expr, $hosts:expr, $now:expr, $fence:expr) => {{
        use crate::store::sql::hosts as statements;
        let (store, instance, service, now, fence) = ($store, $instance, $service, $now, $fence);
        let hosts: &[String] = $hosts;
        if hosts.len() > crate::core::hosts::HOSTS_PER_CLAIM_MAX {
            return Err(StoreError::Conflict(format!(
                "hosts: {} in one claim, at most {}",
                hosts.len(),
                crate::core::hosts::HOSTS_PER_CLAIM_MAX
            )));
        }
        let hosts: std::collections::BTreeSet<&str> = hosts.iter().map(String::as_str).collect();
        crate::store::sql::timed("reserve_hosts", store.call_timeout, async {
            let mut tx = store.fenced_transaction(fence).await?;
            let mut held = Vec::with_capacity(hosts.len());
            for host in hosts {
                sqlx::query(statements::RESERVE_HOST)
                    .bind(host)
                    .bind(instance.as_str())
                    .bind(service.as_str())
                    .bind(timestamp_to_us(now))
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
                let holder: Option<(String, String, String, i64)> =
                    sqlx::query_as(statements::HOST_HOLDER)
                        .bind(host)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db_error)?;
                if let Some(row) = holder {
                    held.push(crate::store::sql::rows::decode_host_reservation(row)?);
                }
            }
            tx.commit().await.map_err(db_error)?;
            Ok(held)
        })
        .await
    }};
}

/// The body of `Store::host_reservations`, as [`reserve_hosts`]'s.
macro_rules! host_reservations {
    ($store:expr) => {{
        let store = $store;
        crate::store::sql::timed("host_reservations", store.call_timeout, async {
            let rows: Vec<(String, String, String, i64)> =
                sqlx::query_as(crate::store::sql::hosts::HOST_RESERVATIONS)
                    .fetch_all(&store.pool)
                    .await
                    .map_err(db_error)?;
            rows.into_iter()
                .map(crate::store::sql::rows::decode_host_reservation)
                .collect()
        })
        .await
    }};
}

pub(super) use {host_reservations, reserve_hosts};
