//! What is kept: term history (the ring, its length changing, its migration),
//! a swept expiry recorded once, released keys forgotten with fences never
//! repeating.

use super::*;

/// A key released cleanly is forgotten after its retention: NOT_FOUND, its
/// old fence unknown, and a fresh grant's fence above every earlier one.
#[tokio::test]
async fn released_keys_are_forgotten_and_fences_never_repeat() {
    let schema = schema_or_skip!();
    let server = PgServer::start_with(PgConfig {
        retention_ms: 200,
        ..schema.config()
    })
    .await;
    let mut c = server.client().await;
    let lease = lease_of(c.acquire(acquire("k", "a", 5_000)).await.unwrap());
    let other = lease_of(c.acquire(acquire("other", "a", 5_000)).await.unwrap());
    c.release(release(&lease, false)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.backend.sweep().await.unwrap();

    assert_eq!(c.get(get("k")).await.unwrap_err().code(), Code::NotFound);
    let refused = c.check(check("k", lease.fence)).await.unwrap_err();
    assert_eq!(stale_reason(&refused), StaleReason::Unknown);
    let again = c
        .acquire(acquire("k", "b", 5_000))
        .await
        .unwrap()
        .into_inner();
    assert!(again.previous.is_none());
    assert!(again.lease.unwrap().fence > other.fence.max(lease.fence));
}

/// Every way a term ends records it in the history exactly once, and the
/// history keeps exactly the newest `history_len` (#12: the statements
/// that end a term write its entry into the key's ring, and a lone release
/// skips the row lock taken first): a lone release, an
/// expiry moved by the grant that replaces it, an expiry moved by the
/// sweeper and then found again by a grant (which must not record it twice,
/// nor fail), and releases batched together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ended_term_is_recorded_once_and_the_newest_are_kept() {
    let schema = schema_or_skip!();
    let server = PgServer::start_with(PgConfig {
        history_len: 6,
        ..schema.config_without_sweeper()
    })
    .await;
    let mut c = server.client().await;
    let history = |mut c: LeaseholdClient<Channel>, key: &str| {
        let key = key.to_string();
        async move {
            c.history(pb::HistoryRequest {
                key,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .entries
            .iter()
            .map(|h| (h.fence, h.end))
            .collect::<Vec<_>>()
        }
    };
    let (released, expired) = (pb::TermEnd::Released as i32, pb::TermEnd::Expired as i32);
    let mut ended = Vec::new();

    let lone = lease_of(c.acquire(acquire("h", "a", 5_000)).await.unwrap());
    c.release(release(&lone, false)).await.unwrap();
    ended.push((lone.fence, released));

    // Expired, and moved by the grant that replaces it.
    let lapsed = lease_of(c.acquire(acquire("h", "a", 200)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let next = lease_of(c.acquire(acquire("h", "b", 5_000)).await.unwrap());
    ended.push((lapsed.fence, expired));
    c.release(release(&next, false)).await.unwrap();
    ended.push((next.fence, released));

    // Expired, moved by the sweeper, then offered again by a grant.
    let lapsed = lease_of(c.acquire(acquire("h", "a", 200)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.backend.sweep().await.unwrap();
    let next = lease_of(c.acquire(acquire("h", "b", 5_000)).await.unwrap());
    ended.push((lapsed.fence, expired));
    c.release(release(&next, false)).await.unwrap();
    ended.push((next.fence, released));
    let mut newest_first = ended.clone();
    newest_first.reverse();
    assert_eq!(history(c.clone(), "h").await, newest_first);

    for i in 0..4 {
        let lease = lease_of(
            c.acquire(acquire("h", &format!("w{i}"), 5_000))
                .await
                .unwrap(),
        );
        c.release(release(&lease, false)).await.unwrap();
        ended.push((lease.fence, released));
    }
    // `ended` is in fence order (each term began after the one before).
    let newest_first: Vec<_> = ended.iter().rev().take(6).cloned().collect();
    assert_eq!(history(c.clone(), "h").await, newest_first);
    let db = schema.db().await;
    let rows: i64 = db
        .query_one("SELECT count(*) FROM term_history WHERE key = 'h'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 6, "a ring of 6");

    // Releases batched together: each term once.
    let keys: Vec<String> = (0..24).map(|i| format!("m/{i}")).collect();
    for round in 0..8 {
        let cycles: Vec<_> = keys
            .iter()
            .map(|key| {
                let (mut c, key) = (c.clone(), key.clone());
                tokio::spawn(async move {
                    let lease = lease_of(c.acquire(acquire(&key, "m", 5_000)).await.unwrap());
                    c.release(release(&lease, false)).await.unwrap();
                    lease.fence
                })
            })
            .collect();
        for (key, cycle) in keys.iter().zip(cycles) {
            let fence = cycle.await.unwrap();
            let got = history(c.clone(), key).await;
            assert_eq!(got.len(), (round + 1).min(6), "{key}: {got:?}");
            assert_eq!(got[0], (fence, released), "{key}");
        }
    }
    assert!(
        counter(&server, "leasehold_pg_release_batches_total")
            < counter(&server, "leasehold_pg_release_batched_total"),
        "some releases shared a statement"
    );
}

/// Every page of a key's History, newest first, `page_size` at a time: the
/// fences, and how each term ended.
async fn history_pages(
    c: &mut LeaseholdClient<Channel>,
    key: &str,
    page_size: u32,
) -> Vec<(u64, i32)> {
    let mut entries = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = c
            .history(pb::HistoryRequest {
                key: key.into(),
                page_size,
                page_token,
            })
            .await
            .unwrap()
            .into_inner();
        entries.extend(page.entries.iter().map(|h| (h.fence, h.end)));
        if page.next_page_token.is_empty() {
            return entries;
        }
        page_token = page.next_page_token;
    }
}

/// Acquires and releases `key` `n` times through `c`, appending each
/// term's fence to `ended`.
async fn cycles(c: &mut LeaseholdClient<Channel>, key: &str, n: usize, ended: &mut Vec<u64>) {
    for _ in 0..n {
        let lease = lease_of(c.acquire(acquire(key, "cycler", 5_000)).await.unwrap());
        c.release(release(&lease, false)).await.unwrap();
        ended.push(lease.fence);
    }
}

/// The newest `n` of `ended` (in fence order), newest first.
fn newest(ended: &[u64], n: usize) -> Vec<u64> {
    ended.iter().rev().take(n).copied().collect()
}

/// The rows a key's history takes in the database.
async fn history_rows(schema: &Schema, key: &str) -> i64 {
    schema
        .db()
        .await
        .query_one("SELECT count(*) FROM term_history WHERE key = $1", &[&key])
        .await
        .unwrap()
        .get(0)
}

/// History wraps around the key's ring (#12, migration 0008): after many
/// more terms than `history_len`, every page shows exactly the newest, in
/// order, and the key keeps that many rows.
#[tokio::test]
async fn history_after_the_ring_wraps_shows_exactly_the_newest() {
    let schema = schema_or_skip!();
    let server = PgServer::start_with(PgConfig {
        history_len: 5,
        ..schema.config_without_sweeper()
    })
    .await;
    let mut c = server.client().await;
    let mut ended = Vec::new();
    for n in [3, 2, 1, 7, 4] {
        cycles(&mut c, "ring", n, &mut ended).await;
        let want = newest(&ended, 5);
        assert_eq!(fences(&history_pages(&mut c, "ring", 2).await), want);
        assert_eq!(fences(&history_pages(&mut c, "ring", 100).await), want);
        assert_eq!(history_rows(&schema, "ring").await, want.len() as i64);
    }
}

/// Servers restarted with another `history_len` on one schema (#12): a
/// longer length loses none of the entries kept and shows the newest as
/// they come (its ring grows, here from one that had wrapped mid-way); a
/// shorter one shows its own newest, and the entries beyond it stay for
/// a longer length started later.
#[tokio::test]
async fn history_survives_length_changes_between_starts() {
    let schema = schema_or_skip!();
    let start = |history_len| {
        PgServer::start_with(PgConfig {
            history_len,
            ..schema.config_without_sweeper()
        })
    };
    let mut ended = Vec::new();

    let mut four = start(4).await;
    let mut c = four.client().await;
    cycles(&mut c, "len", 6, &mut ended).await;
    assert_eq!(
        fences(&history_pages(&mut c, "len", 3).await),
        newest(&ended, 4)
    );
    four.stop().await;

    // Longer: the four kept stay, and the ring fills up to seven.
    let mut seven = start(7).await;
    let mut c = seven.client().await;
    assert_eq!(
        fences(&history_pages(&mut c, "len", 3).await),
        newest(&ended, 4)
    );
    for n in [1, 1, 1, 1, 5] {
        let kept = history_pages(&mut c, "len", 100).await.len();
        cycles(&mut c, "len", n, &mut ended).await;
        let want = newest(&ended, (kept + n).min(7));
        assert_eq!(fences(&history_pages(&mut c, "len", 3).await), want);
    }
    seven.stop().await;

    // Shorter: exactly its own newest three.
    let mut three = start(3).await;
    let mut c = three.client().await;
    for n in [0, 2, 4] {
        cycles(&mut c, "len", n, &mut ended).await;
        assert_eq!(
            fences(&history_pages(&mut c, "len", 2).await),
            newest(&ended, 3)
        );
    }
    three.stop().await;

    // Longer again: the terms the shorter server recorded, and the ones
    // before them, are all there.
    let seven = start(7).await;
    let mut c = seven.client().await;
    assert_eq!(
        fences(&history_pages(&mut c, "len", 3).await),
        newest(&ended, 7)
    );
    cycles(&mut c, "len", 2, &mut ended).await;
    assert_eq!(
        fences(&history_pages(&mut c, "len", 4).await),
        newest(&ended, 7)
    );
    assert_eq!(history_rows(&schema, "len").await, 7);
}

/// Two servers with different `history_len` serving one key at once (#12):
/// each shows exactly its own newest, whichever server ended the terms.
#[tokio::test]
async fn servers_with_different_lengths_each_show_their_newest() {
    let schema = schema_or_skip!();
    let start = |history_len| {
        PgServer::start_with(PgConfig {
            history_len,
            ..schema.config_without_sweeper()
        })
    };
    let (short, long) = (start(2).await, start(6).await);
    let (mut s, mut l) = (short.client().await, long.client().await);
    let mut ended = Vec::new();
    for n in [3, 0, 2, 1, 4] {
        cycles(&mut l, "two", 1, &mut ended).await;
        cycles(&mut s, "two", n, &mut ended).await;
        assert_eq!(
            fences(&history_pages(&mut s, "two", 1).await),
            newest(&ended, 2)
        );
        assert_eq!(
            fences(&history_pages(&mut l, "two", 4).await),
            newest(&ended, 6)
        );
    }

    // The shorter server first: what it kept, then the longer one's ring.
    let mut ended = Vec::new();
    cycles(&mut s, "short-first", 3, &mut ended).await;
    assert_eq!(
        fences(&history_pages(&mut l, "short-first", 4).await),
        newest(&ended, 2)
    );
    for (by_long, by_short, shown) in [(1, 0, 3), (0, 2, 5), (3, 0, 6), (0, 5, 6)] {
        cycles(&mut l, "short-first", by_long, &mut ended).await;
        cycles(&mut s, "short-first", by_short, &mut ended).await;
        assert_eq!(
            fences(&history_pages(&mut s, "short-first", 1).await),
            newest(&ended, 2)
        );
        assert_eq!(
            fences(&history_pages(&mut l, "short-first", 4).await),
            newest(&ended, shown)
        );
    }
}

/// A term the sweeper moved to ended is recorded once when a grant then
/// replaces it, also once the key's ring is full and wrapped (#12): the
/// grant offers the term again, and must neither record it a second time
/// nor overwrite an older entry with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swept_expiry_is_recorded_once_when_a_grant_replaces_it() {
    let schema = schema_or_skip!();
    let server = PgServer::start_with(PgConfig {
        history_len: 3,
        ..schema.config_without_sweeper()
    })
    .await;
    let mut c = server.client().await;
    let (released, expired) = (pb::TermEnd::Released as i32, pb::TermEnd::Expired as i32);
    let mut ended = Vec::new();
    for round in 0..4 {
        let mut fences_ended = Vec::new();
        cycles(&mut c, "swept", round + 1, &mut fences_ended).await;
        ended.extend(fences_ended.iter().map(|fence| (*fence, released)));
        let lapsed = lease_of(c.acquire(acquire("swept", "a", 200)).await.unwrap());
        tokio::time::sleep(Duration::from_millis(400)).await;
        server.backend.sweep().await.unwrap();
        ended.push((lapsed.fence, expired));
        let reply = c
            .acquire(acquire("swept", "b", 5_000))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.previous.unwrap().fence, lapsed.fence);
        let next = reply.lease.unwrap();
        let want: Vec<_> = ended.iter().rev().take(3).copied().collect();
        assert_eq!(
            history_pages(&mut c, "swept", 100).await,
            want,
            "round {round}"
        );
        c.release(release(&next, false)).await.unwrap();
        ended.push((next.fence, released));
        let want: Vec<_> = ended.iter().rev().take(3).copied().collect();
        assert_eq!(
            history_pages(&mut c, "swept", 2).await,
            want,
            "round {round}"
        );
    }
    assert_eq!(history_rows(&schema, "swept").await, 3);
}

/// Migration 0008 turns each key's history rows into its ring keeping every
/// entry (#12): a key with more rows than `history_len` shows its newest,
/// a key with fewer shows all, and both go on recording in order.
#[tokio::test]
async fn the_ring_migration_keeps_the_newest_entries() {
    let schema = schema_or_skip!();
    let (db, connection) = tokio_postgres::connect(&schema.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let name = &schema.name;
    db.batch_execute(&format!(
        "CREATE SCHEMA {name}; SET search_path = {name};
         CREATE TABLE leasehold_migrations (version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp());"
    ))
    .await
    .unwrap();
    // Version 7, as a server of that version left it.
    for (index, migration) in leasehold_server::postgres::migrate::MIGRATIONS[..7]
        .iter()
        .enumerate()
    {
        db.batch_execute(migration).await.unwrap();
        db.execute(
            "INSERT INTO leasehold_migrations (version) VALUES ($1)",
            &[&(index as i32 + 1)],
        )
        .await
        .unwrap();
    }
    db.batch_execute(
        "SELECT setval('fences', 1000);
         INSERT INTO keys (key, ended_fence, ended_owner, ended_lease_id, ended_end, ended_at_ms,
                           ended_acquired_at_ms)
         VALUES ('many', 110, 'o', gen_random_uuid(), 1, now_ms(), now_ms()),
                ('few', 202, 'o', gen_random_uuid(), 1, now_ms(), now_ms());
         INSERT INTO term_history (key, fence, owner, acquired_at_ms, ended_at_ms, end_kind,
                                   unsettled_tool_calls, handed_off)
         SELECT 'many', f, 'o', now_ms(), now_ms(), CASE WHEN f % 3 = 0 THEN 3 ELSE 1 END, 0, false
         FROM generate_series(101, 110) f
         UNION ALL
         SELECT 'few', f, 'o', now_ms(), now_ms(), 1, 0, false FROM generate_series(201, 202) f;",
    )
    .await
    .unwrap();

    let server = PgServer::start_with(PgConfig {
        history_len: 4,
        ..schema.config_without_sweeper()
    })
    .await;
    let mut c = server.client().await;
    let mut many: Vec<u64> = (101..=110).collect();
    let mut few: Vec<u64> = vec![201, 202];
    let got = history_pages(&mut c, "many", 3).await;
    assert_eq!(fences(&got), newest(&many, 4));
    let expired = pb::TermEnd::Expired as i32;
    assert_eq!(got[2], (108, expired), "the end kinds came along");
    assert_eq!(
        fences(&history_pages(&mut c, "few", 3).await),
        newest(&few, 4)
    );
    for n in [1, 3, 9] {
        cycles(&mut c, "many", n, &mut many).await;
        cycles(&mut c, "few", n, &mut few).await;
        assert_eq!(
            fences(&history_pages(&mut c, "many", 3).await),
            newest(&many, 4)
        );
        assert_eq!(
            fences(&history_pages(&mut c, "few", 3).await),
            newest(&few, 4)
        );
    }
    assert_eq!(
        history_rows(&schema, "many").await,
        10,
        "the ring never shrinks"
    );
    assert_eq!(history_rows(&schema, "few").await, 4);
}
