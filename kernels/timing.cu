// Infrastructure for helpers.time_gpu, not a chapter's kernel.
//
// hold_gpu keeps the GPU busy for a given number of nanoseconds. The timer
// launches it just before the timed repetitions so that the host can queue all
// of them while the GPU waits: the events around each repetition then measure
// only GPU work, never a gap in which the GPU sat idle waiting for Python to
// issue the next launch (which would inflate the time of a short kernel).
extern "C" __global__ void hold_gpu(unsigned long long nanoseconds) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanoseconds);
}
