//! Collectives across real processes on localhost, each a copy of this
//! test binary started with the `env://` variables torchrun sets: every op
//! against values computed from the ranks, then the faults (a peer killed
//! with SIGKILL, a peer that never arrives, ranks that disagree on a shape,
//! a job whose other ranks never start).
//!
//! A parent test starts the ranks and checks their exit codes; the
//! `worker` test is what each rank runs, and does nothing when run alone.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tpu_core::{DType, Device, Error, HostBuffer, HostTensor, Tensor};
use tpu_dist::{ProcessGroup, ReduceOp};

const ROLE: &str = "TPU_DIST_TEST_ROLE";
/// What a rank prints once its scenario has run to the end.
const DONE: &str = "worker: scenario done";
/// The fault tests' timeout, in seconds.
const TIMEOUT: f64 = 3.0;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `world` ranks running `scenario`, with `TPU_DIST_TIMEOUT`.
fn start(scenario: &str, world: usize, ranks: &[usize], timeout: f64) -> Vec<(usize, Child)> {
    let port = free_port();
    ranks
        .iter()
        .map(|&rank| {
            let child = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "worker", "--nocapture", "--test-threads=1"])
                .env(ROLE, scenario)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("TPU_DIST_TIMEOUT", timeout.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (rank, child)
        })
        .collect()
}

/// Waits for every rank (killing all of them after `limit`) and asserts
/// each exited 0, showing the output of any that did not.
fn finish(children: Vec<(usize, Child)>, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut failures = Vec::new();
    for (rank, mut child) in children {
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let output = child.wait_with_output().unwrap();
        // The rank says it ran its scenario: a filter that matched nothing
        // would exit 0 too.
        let ran = String::from_utf8_lossy(&output.stdout).contains(DONE);
        if status.is_none_or(|s| !s.success()) || !ran {
            failures.push(format!(
                "rank {rank}: {status:?}\n--- stdout\n{}\n--- stderr\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn run(scenario: &str, world: usize) {
    let ranks: Vec<usize> = (0..world).collect();
    finish(
        start(scenario, world, &ranks, 60.0),
        Duration::from_secs(120),
    );
}

#[test]
fn every_collective_on_2_processes() {
    run("collectives", 2);
}

#[test]
fn every_collective_on_1_process() {
    run("collectives", 1);
}

#[test]
fn every_collective_on_3_processes() {
    run("collectives", 3);
}

#[test]
fn a_group_meets_in_a_store_of_its_own() {
    run("own_store", 3);
}

#[test]
fn devices_of_2_processes_reduce_in_graph_then_across() {
    run("world", 2);
}

#[test]
fn a_killed_peer_fails_the_survivors_within_twice_the_timeout() {
    let mut ranks = start("killed", 3, &[0, 1, 2], TIMEOUT);
    let (_, victim) = &mut ranks[2];
    // Rank 2 says when it has joined; then it dies without a word.
    let joined = BufReader::new(victim.stdout.as_mut().unwrap())
        .lines()
        .any(|line| line.unwrap().contains("joined"));
    assert!(joined, "rank 2 exited before joining");
    victim.kill().unwrap();
    let (_, mut victim) = ranks.pop().unwrap();
    victim.wait().unwrap();
    finish(ranks, Duration::from_secs(30));
}

#[test]
fn a_peer_that_never_arrives_is_named_after_the_timeout() {
    run_with_timeout("stuck", 3);
}

#[test]
fn ranks_that_disagree_on_the_shape_get_an_error() {
    run_with_timeout("mismatch", 2);
}

#[test]
fn a_job_whose_peers_never_start_fails_at_init() {
    finish(start("alone", 2, &[0], TIMEOUT), Duration::from_secs(30));
}

#[test]
fn malformed_launcher_variables_are_errors_naming_the_variable() {
    for (variable, value) in [
        ("RANK", "abc"),
        ("RANK", "5"),
        ("WORLD_SIZE", "0"),
        ("MASTER_PORT", "99999"),
        ("TPU_DIST_TIMEOUT", "-1"),
        ("TPU_DIST_TIMEOUT", "soon"),
    ] {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "worker", "--nocapture"])
            .env(ROLE, "bad_env")
            .env("RANK", "0")
            .env("WORLD_SIZE", "2")
            .env("MASTER_PORT", free_port().to_string())
            .env(variable, value)
            .env("TPU_DIST_EXPECT", variable)
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains(DONE),
            "{variable}={value}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn run_with_timeout(scenario: &str, world: usize) {
    let ranks: Vec<usize> = (0..world).collect();
    finish(
        start(scenario, world, &ranks, TIMEOUT),
        Duration::from_secs(30),
    );
}

/// What one rank runs; a no-op unless a parent test started it.
#[test]
fn worker() {
    let Ok(scenario) = std::env::var(ROLE) else {
        return;
    };
    match scenario.as_str() {
        "collectives" => collectives(&ProcessGroup::from_env().unwrap()),
        "world" => world(),
        "own_store" => own_store(),
        "killed" => killed(),
        "stuck" => stuck(),
        "mismatch" => mismatch(),
        "alone" => alone(),
        "bad_env" => bad_env(),
        other => panic!("unknown scenario {other}"),
    }
    println!("{DONE}");
}

/// Rank `r`'s value at element `i`: small integers, so every reduction is
/// exact in every dtype and order.
fn value(r: usize, i: usize) -> f64 {
    ((r * 5 + i * 3) % 7) as f64 - 3.0
}

fn host(dtype: DType, dims: &[usize], f: impl Fn(usize) -> f64) -> HostBuffer {
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| {
            let x = f(i);
            match dtype {
                DType::Bool => f64::from(u8::from(x > 0.0)),
                DType::U8 | DType::U32 => x + 3.0,
                _ => x,
            }
        })
        .collect();
    HostTensor::from_f64(dtype, dims.to_vec(), v)
        .unwrap()
        .to_buffer()
}

fn f64s(b: &HostBuffer) -> Vec<f64> {
    HostTensor::from_buffer(b)
        .to_f64()
        .iter()
        .copied()
        .collect()
}

fn reduce(op: ReduceOp, dtype: DType, values: &[f64]) -> f64 {
    let bool_like = dtype == DType::Bool;
    match op {
        ReduceOp::Sum if bool_like => values.iter().copied().fold(0.0, f64::max),
        ReduceOp::Prod if bool_like => values.iter().copied().fold(1.0, f64::min),
        ReduceOp::Sum => values.iter().sum(),
        ReduceOp::Mean => values.iter().sum::<f64>() / values.len() as f64,
        ReduceOp::Max => values.iter().copied().fold(f64::MIN, f64::max),
        ReduceOp::Min => values.iter().copied().fold(f64::MAX, f64::min),
        ReduceOp::Prod => values.iter().product(),
    }
}

fn collectives(pg: &ProcessGroup) {
    let (rank, n) = (pg.rank(), pg.world_size());
    let dims = [2, 6];
    // all_reduce: every dtype and reduction, on the host.
    for dtype in DType::ALL {
        for op in [
            ReduceOp::Sum,
            ReduceOp::Mean,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Prod,
        ] {
            let x = host(dtype, &dims, |i| value(rank, i));
            let result = pg.all_reduce_host(x, op);
            // Means need a float or complex type; complex values have no
            // order and their products mix parts: they sum and average only.
            let allowed = op != ReduceOp::Mean || dtype.is_inexact();
            let allowed =
                allowed && (!dtype.is_complex() || matches!(op, ReduceOp::Sum | ReduceOp::Mean));
            let Ok(got) = result else {
                assert!(!allowed, "{dtype} {op}: {}", result.unwrap_err());
                continue;
            };
            assert!(allowed, "{dtype} {op} should be refused");
            let stored: Vec<Vec<f64>> = (0..n)
                .map(|r| f64s(&host(dtype, &dims, |i| value(r, i))))
                .collect();
            let want: Vec<f64> = (0..12)
                .map(|i| reduce(op, dtype, &stored.iter().map(|v| v[i]).collect::<Vec<_>>()))
                .collect();
            let want = f64s(
                &HostTensor::from_f64(dtype, dims.to_vec(), want)
                    .unwrap()
                    .to_buffer(),
            );
            // A mean may round differently from the f64 reference by an ulp.
            let tol = match (op, dtype) {
                (ReduceOp::Mean, DType::F16 | DType::BF16) => 1e-2,
                (ReduceOp::Mean, _) => 1e-6,
                _ => 0.0,
            };
            for (g, w) in f64s(&got).iter().zip(&want) {
                assert!(
                    (g - w).abs() <= tol * w.abs(),
                    "all_reduce {op} on {dtype}: {g} vs {w}"
                );
            }
        }
    }

    // The device forms, on this process's first device.
    let device = Device::Tpu(0);
    let on_device = |b: HostBuffer| Tensor::from_host(HostTensor::from_buffer(&b), device).unwrap();
    let back = |t: Tensor| {
        t.to_host()
            .unwrap()
            .to_f64()
            .iter()
            .copied()
            .collect::<Vec<_>>()
    };
    let mine = host(DType::F32, &dims, |i| value(rank, i));

    let sum = pg
        .all_reduce(&on_device(mine.clone()), ReduceOp::Sum)
        .unwrap();
    let want: Vec<f64> = (0..12).map(|i| (0..n).map(|r| value(r, i)).sum()).collect();
    assert_eq!(back(sum), want);

    // all_gather along each dim.
    for dim in 0..2 {
        let got = back(pg.all_gather(&on_device(mine.clone()), dim).unwrap());
        let mut want = Vec::new();
        if dim == 0 {
            for r in 0..n {
                want.extend((0..12).map(|i| value(r, i)));
            }
        } else {
            for row in 0..2 {
                for r in 0..n {
                    want.extend((0..6).map(|c| value(r, row * 6 + c)));
                }
            }
        }
        assert_eq!(got, want, "all_gather dim {dim}");
    }

    // broadcast from every root.
    for root in 0..n {
        let got = back(pg.broadcast(&on_device(mine.clone()), root).unwrap());
        assert_eq!(got, (0..12).map(|i| value(root, i)).collect::<Vec<_>>());
    }

    // reduce_scatter and all_to_all along dim 1 of a [2, 6n] tensor.
    let wide = [2, 6 * n];
    let x = host(DType::F32, &wide, |i| value(rank, i));
    let got = back(
        pg.reduce_scatter(&on_device(x.clone()), ReduceOp::Sum, 1)
            .unwrap(),
    );
    let want: Vec<f64> = (0..2)
        .flat_map(|row| {
            (0..6).map(move |c| (0..n).map(|r| value(r, row * 6 * n + rank * 6 + c)).sum())
        })
        .collect();
    assert_eq!(got, want, "reduce_scatter");

    // reduce_scatter in every dtype and reduction, on the host.
    for dtype in DType::ALL {
        for op in [
            ReduceOp::Sum,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Prod,
            ReduceOp::Mean,
        ] {
            if op == ReduceOp::Mean && !dtype.is_inexact() {
                continue;
            }
            if dtype.is_complex() && !matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
                let mine = host(dtype, &wide, |i| value(rank, i));
                assert!(
                    pg.reduce_scatter_host(mine, op, 1).is_err(),
                    "{dtype} {op:?}"
                );
                continue;
            }
            let mine = host(dtype, &wide, |i| value(rank, i));
            let got = f64s(&pg.reduce_scatter_host(mine, op, 1).unwrap());
            let stored: Vec<Vec<f64>> = (0..n)
                .map(|r| f64s(&host(dtype, &wide, |i| value(r, i))))
                .collect();
            let want: Vec<f64> = (0..2)
                .flat_map(|row| (0..6).map(move |c| row * 6 * n + rank * 6 + c))
                .map(|i| reduce(op, dtype, &stored.iter().map(|v| v[i]).collect::<Vec<_>>()))
                .collect();
            let want = f64s(
                &HostTensor::from_f64(dtype, vec![2, 6], want)
                    .unwrap()
                    .to_buffer(),
            );
            let tol = if op == ReduceOp::Mean { 1e-2 } else { 0.0 };
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= tol * w.abs(),
                    "reduce_scatter {op} on {dtype}: {g} vs {w}"
                );
            }
        }
    }

    let got = back(pg.all_to_all(&on_device(x), 1, 0).unwrap());
    let want: Vec<f64> = (0..n)
        .flat_map(|src| {
            (0..2).flat_map(move |row| (0..6).map(move |c| value(src, row * 6 * n + rank * 6 + c)))
        })
        .collect();
    assert_eq!(got, want, "all_to_all");
    all_to_all_with_splits(pg);

    // A ring of sends: each rank sends to the next and receives from the
    // previous.
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    let payload = host(DType::I64, &[3], |i| value(rank, i));
    if n == 1 {
        // Alone, there is no one to send to.
    } else if rank % 2 == 0 {
        pg.send_host(&payload, next).unwrap();
        let got = pg.recv_host(DType::I64, vec![3], prev).unwrap();
        assert_eq!(
            f64s(&got),
            f64s(&host(DType::I64, &[3], |i| value(prev, i)))
        );
    } else {
        let got = pg.recv_host(DType::I64, vec![3], prev).unwrap();
        assert_eq!(
            f64s(&got),
            f64s(&host(DType::I64, &[3], |i| value(prev, i)))
        );
        pg.send_host(&payload, next).unwrap();
    }
    pg.barrier().unwrap();

    // Bad calls are typed errors before any traffic, and the group stays
    // usable.
    if n > 1 {
        let odd = host(DType::F32, &[2, 3 * n + 1], |i| value(rank, i));
        let err = pg.reduce_scatter_host(odd, ReduceOp::Sum, 1).unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    }
    let err = pg.send_host(&payload, rank).unwrap_err();
    assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
    pg.barrier().unwrap();
}

/// Rank `r` sends `(r + j) % 3` rows of 2 to rank `j`: some blocks are
/// empty, no two ranks send alike.
fn all_to_all_with_splits(pg: &ProcessGroup) {
    let (rank, n) = (pg.rank(), pg.world_size());
    let splits = |r: usize| (0..n).map(|j| (r + j) % 3).collect::<Vec<_>>();
    let rows: usize = splits(rank).iter().sum();
    let x = host(DType::I32, &[rows, 2], |i| value(rank, i));
    let output_splits: Vec<usize> = (0..n).map(|j| splits(j)[rank]).collect();
    let got = pg
        .all_to_all_v_host(x.clone(), &splits(rank), &output_splits)
        .unwrap();
    assert_eq!(got.shape().dims(), [output_splits.iter().sum(), 2]);
    let want: Vec<f64> = (0..n)
        .flat_map(|src| {
            let first: usize = splits(src)[..rank].iter().sum();
            (first * 2..(first + splits(src)[rank]) * 2).map(move |i| value(src, i))
        })
        .collect();
    assert_eq!(f64s(&got), want, "all_to_all with splits");

    // Rank 0 expects a row more from the last rank than it is sent: every
    // rank learns of it alike, and the group stays usable.
    if n > 1 {
        let mut expected = output_splits.clone();
        if rank == 0 {
            expected[n - 1] += 1;
        }
        let err = pg
            .all_to_all_v_host(x.clone(), &splits(rank), &expected)
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
        assert!(err.to_string().contains("rank 0 expects"), "{err}");
    }
    let err = pg.all_to_all_v_host(x, &[rows], &[rows]).err();
    assert_eq!(n == 1, err.is_none(), "{err:?}");
    pg.barrier().unwrap();
}

/// A group meeting in a store served for it alone, as the PyTorch backend
/// makes it: rank 0 serves on `MASTER_PORT`, which the parent chose.
fn own_store() {
    let options = tpu_dist::JobOptions::from_env().unwrap();
    let address = format!("127.0.0.1:{}", options.master_port);
    let store = if options.rank == 0 {
        tpu_dist::Store::serve(&format!("0.0.0.0:{}", options.master_port), options.timeout)
    } else {
        tpu_dist::Store::connect(&address, options.timeout)
    }
    .unwrap();
    assert_eq!(
        tpu_dist::Store::local_ip_towards("127.0.0.1").unwrap(),
        "127.0.0.1"
    );
    let pg = ProcessGroup::with_store(&options, store).unwrap();
    let x = HostBuffer::from_slice(&[pg.rank() as f32 + 1.0; 3], vec![3]).unwrap();
    let sum = pg.all_reduce_host(x, ReduceOp::Sum).unwrap();
    let n = pg.world_size() as f32;
    assert_eq!(sum.to_vec::<f32>().unwrap(), [n * (n + 1.0) / 2.0; 3]);
    pg.barrier().unwrap();
}

/// Two devices in each process: global rank `2p + d` holds `value(2p + d, i)`.
fn world() {
    let local = tpu_dist::DeviceGroup::new(vec![0, 1]).unwrap();
    let world = tpu_dist::World::from_env(local.clone()).unwrap();
    assert_eq!(world.size(), 4);
    let first = world.first_rank();
    let xs: Vec<Tensor> = (0..2)
        .map(|d| {
            let b = host(DType::F32, &[6], |i| value(first + d, i));
            Tensor::from_host(HostTensor::from_buffer(&b), local.device(d)).unwrap()
        })
        .collect();
    let back = |t: &Tensor| {
        t.to_host()
            .unwrap()
            .to_f64()
            .iter()
            .copied()
            .collect::<Vec<_>>()
    };
    let sum: Vec<f64> = (0..6).map(|i| (0..4).map(|g| value(g, i)).sum()).collect();
    for (d, y) in world
        .all_reduce(&xs, ReduceOp::Sum)
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(y.device(), local.device(d));
        assert_eq!(back(y), sum);
    }
    let mean: Vec<f64> = sum.iter().map(|s| s / 4.0).collect();
    for y in world.all_reduce(&xs, ReduceOp::Mean).unwrap() {
        assert_eq!(back(&y), mean);
    }
    for y in world.broadcast(&xs, 3).unwrap() {
        assert_eq!(back(&y), (0..6).map(|i| value(3, i)).collect::<Vec<_>>());
    }
    world.barrier().unwrap();
}

fn timeout() -> Duration {
    Duration::from_secs_f64(TIMEOUT)
}

/// Survivors of a rank killed after joining.
fn killed() {
    let pg = ProcessGroup::from_env().unwrap();
    if pg.rank() == 2 {
        println!("joined");
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let start = Instant::now();
    let x = HostBuffer::from_slice(&[1.0f32; 4], vec![4]).unwrap();
    // The first collectives may still meet while rank 2 is alive; the
    // loop ends at the first failure.
    let err = loop {
        match pg.all_reduce_host(x.clone(), ReduceOp::Sum) {
            Ok(_) if start.elapsed() < Duration::from_secs(20) => continue,
            Ok(_) => panic!("collectives kept succeeding with rank 2 dead"),
            Err(e) => break e,
        }
    };
    assert!(
        start.elapsed() < 2 * timeout(),
        "took {:?}",
        start.elapsed()
    );
    let Error::Collective { op, missing, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(op, "all_reduce");
    assert_eq!(missing, &[2], "{err}");
    // The group stays failed, quickly.
    let again = pg.barrier().unwrap_err();
    assert!(again.to_string().contains("failed earlier"), "{again}");
}

/// Rank 1 joins and then never calls the collective the others wait in.
fn stuck() {
    let pg = ProcessGroup::from_env().unwrap();
    if pg.rank() == 1 {
        std::thread::sleep(3 * timeout());
        return;
    }
    let start = Instant::now();
    let err = pg.barrier().unwrap_err();
    let took = start.elapsed();
    assert!(
        took >= timeout() / 2 && took < 2 * timeout(),
        "took {took:?}"
    );
    let Error::Collective {
        op, seq, missing, ..
    } = &err
    else {
        panic!("{err}");
    };
    assert_eq!((op.as_str(), *seq), ("barrier", 0));
    assert_eq!(missing, &[1], "{err}");
    assert!(err.to_string().contains("rank 1 did not arrive"), "{err}");
    // The store lives on rank 0: it stays until rank 2 has read it.
    if pg.rank() == 0 {
        std::thread::sleep(timeout() / 2);
    }
}

/// Rank 1 reduces 8 elements where rank 0 reduces 4.
fn mismatch() {
    let pg = ProcessGroup::from_env().unwrap();
    let len = if pg.rank() == 0 { 4 } else { 8 };
    let x = HostBuffer::from_slice(&vec![1.0f32; len], vec![len]).unwrap();
    let start = Instant::now();
    let err = pg.all_reduce_host(x, ReduceOp::Sum).unwrap_err();
    assert!(
        start.elapsed() < timeout(),
        "a mismatch is found without waiting"
    );
    let text = err.to_string();
    assert!(
        text.contains("all_reduce(sum) on f32[8]") && text.contains("all_reduce(sum) on f32[4]"),
        "{text}"
    );
    // Every rank skipped the payload alike: the group is still usable.
    let x = HostBuffer::from_slice(&[1.0f32; 4], vec![4]).unwrap();
    let sum = pg.all_reduce_host(x, ReduceOp::Sum).unwrap();
    assert_eq!(sum.to_vec::<f32>().unwrap(), [2.0; 4]);
}

/// Rank 0 of 2, alone.
fn alone() {
    let start = Instant::now();
    let err = ProcessGroup::from_env().err().unwrap();
    let took = start.elapsed();
    assert!(took < 2 * timeout(), "took {took:?}");
    assert!(
        matches!(err, Error::Collective { .. } | Error::Rendezvous { .. }),
        "{err}"
    );
}

/// `TPU_DIST_EXPECT` names the variable the launcher set wrong.
fn bad_env() {
    let variable = std::env::var("TPU_DIST_EXPECT").unwrap();
    let err = ProcessGroup::from_env().err().unwrap();
    let Error::InvalidOption { option, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(*option, variable, "{err}");
}
