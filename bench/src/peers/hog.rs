//! A CPU hog for the latency run on a loaded machine: one busy thread per core at the lowest
//! priority (nice 19), as batch work beside a broker on a shared node, stopped when dropped
//! or at its deadline, whichever comes first.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The niceness of the hog's threads: the lowest priority a normal thread can have.
const HOG_NICE: i32 = 19;

/// Numbers each hog, so its threads' names tell them apart from another hog's.
static HOGS_STARTED: AtomicU64 = AtomicU64::new(0);

pub struct CpuHog {
    /// The start of its threads' names (`hog3-0`, `hog3-1`, ...).
    name: String,
    stop: Arc<AtomicBool>,
    spins: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl CpuHog {
    /// Starts `threads` busy threads that stop by themselves after `limit`.
    pub fn start(threads: usize, limit: Duration) -> std::io::Result<CpuHog> {
        let stop = Arc::new(AtomicBool::new(false));
        let spins = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + limit;
        let name = format!("hog{}-", HOGS_STARTED.fetch_add(1, Ordering::Relaxed));
        let mut handles = Vec::with_capacity(threads);
        for index in 0..threads {
            let (stop, spins) = (stop.clone(), spins.clone());
            let handle = std::thread::Builder::new()
                .name(format!("{name}{index}"))
                .spawn(move || spin(&stop, &spins, deadline))?;
            handles.push(handle);
        }
        Ok(CpuHog {
            name,
            stop,
            spins,
            threads: handles,
        })
    }

    /// The start of its threads' names, as `top -H` shows them.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One thread per core the process may run on.
    pub fn threads_per_core() -> usize {
        std::thread::available_parallelism().map_or(1, usize::from)
    }

    /// Stops the threads; returns the rounds of work they did (proof that they ran).
    pub fn stop(mut self) -> u64 {
        self.join();
        self.spins.load(Ordering::Relaxed)
    }

    fn join(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.join();
    }
}

/// Lowers this thread's priority, then does work in rounds until told to stop or `deadline`.
fn spin(stop: &AtomicBool, spins: &AtomicU64, deadline: Instant) {
    lower_priority();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        for _ in 0..10_000 {
            state = std::hint::black_box(state.rotate_left(5) ^ state.wrapping_mul(31));
        }
        spins.fetch_add(1, Ordering::Relaxed);
    }
}

/// nice 19 for the calling thread only: on Linux a thread's niceness is its own.
fn lower_priority() {
    // SAFETY: setpriority reads only its integer arguments; `gettid` names this thread.
    let result =
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, HOG_NICE) };
    if result != 0 {
        eprintln!(
            "cpu hog: could not lower its priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits up to 10 s for `condition`: at nice 19 on a loaded machine the hog runs late.
    fn wait_for(mut condition: impl FnMut() -> bool) {
        let started = Instant::now();
        while !condition() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "not within 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The nice value of each live thread of this process whose name starts with `prefix`.
    fn nice_values(prefix: &str) -> Vec<i32> {
        std::fs::read_dir("/proc/self/task")
            .expect("tasks")
            .filter_map(|task| {
                let task = task.ok()?.path();
                let comm = std::fs::read_to_string(task.join("comm")).ok()?;
                let stat = std::fs::read_to_string(task.join("stat")).ok()?;
                comm.starts_with(prefix).then_some(stat)
            })
            .map(|stat| {
                // Fields from the third (state) on follow the comm's closing paren; nice is the 19th.
                let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
                fields[16].parse::<i32>().unwrap()
            })
            .collect()
    }

    #[test]
    fn the_hog_works_at_nice_19_and_stops_when_asked() {
        let hog = CpuHog::start(2, Duration::from_secs(60)).expect("threads start");
        let name = hog.name.clone();
        wait_for(|| hog.spins.load(Ordering::Relaxed) > 0);
        wait_for(|| nice_values(&name) == vec![HOG_NICE, HOG_NICE]);
        assert!(hog.stop() > 0, "the hog did work");
        assert!(nice_values(&name).is_empty(), "its threads are gone");
    }

    #[test]
    fn the_hog_stops_by_itself_at_its_deadline() {
        let hog = CpuHog::start(1, Duration::from_millis(100)).expect("threads start");
        wait_for(|| hog.threads.iter().all(|thread| thread.is_finished()));
        let rounds = hog.spins.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(hog.stop(), rounds, "no work after the deadline");
    }
}
