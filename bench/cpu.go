package main

import (
	"bufio"
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// CPU per operation: where a measurement's time went, on each side of the wire.
// processCPU (this process, from getrusage) is the client; Redis's is the change in
// INFO cpu's used_cpu_user + used_cpu_sys, read only from a real server (miniredis
// runs inside this process, and its INFO has no cpu section). The host's is the time
// all the machine's CPUs were busy (/proc/stat, Linux only): the client, Redis,
// nats-server and anything else that ran meanwhile.
const (
	mClientCPU = "client_cpu_us_per_op" // CPU µs this process spent per operation
	mRedisCPU  = "redis_cpu_us_per_op"  // CPU µs the Redis server spent per operation
	mHostCPU   = "host_cpu_us_per_op"   // CPU µs the whole machine was busy per operation
	// mCmdsPerRead is how many commands Redis executed per read from a client socket
	// (INFO stats: total_commands_processed over total_reads_processed): the pipeline
	// depth the server saw, all clients together, the meter's own INFO included (one
	// command in one read, so a variant with nothing else in flight reads 1.0; another
	// client's traffic, or a command that spans reads, can take it below 1). Redis
	// pays its per-read costs (the event loop, the read and the reply's write) once
	// per read, so a shallow depth is a dear command.
	mCmdsPerRead = "redis_cmds_per_read"
)

// cpuMeter holds the readings at the start of one measurement.
type cpuMeter struct {
	b                         *bench
	start                     time.Time
	client, redis, host       float64 // CPU seconds so far
	clientOK, redisOK, hostOK bool    // whether each was read
	io                        redisIO // Redis's command and read counts so far
}

// cpuUse is what each side used over a measurement, in cores (CPU seconds per
// second of wall time).
type cpuUse struct {
	client, redis, host       float64
	clientOK, redisOK, hostOK bool
	cmdsPerRead               float64 // 0 when not read
}

// startCPU reads the CPU counters before a measurement.
func (b *bench) startCPU(ctx context.Context) cpuMeter {
	m := cpuMeter{b: b}
	m.client, m.clientOK = processCPU()
	m.redis, m.io, m.redisOK = b.redisCPU(ctx)
	m.host, m.hostOK = hostCPU()
	m.start = time.Now()
	return m
}

// stop reads the counters again and returns what each side used since startCPU.
func (m cpuMeter) stop(ctx context.Context) cpuUse {
	wall := time.Since(m.start).Seconds()
	var u cpuUse
	if c, ok := processCPU(); ok && m.clientOK && wall > 0 {
		u.client, u.clientOK = (c-m.client)/wall, true
	}
	if r, io, ok := m.b.redisCPU(ctx); ok && m.redisOK && wall > 0 {
		u.redis, u.redisOK = (r-m.redis)/wall, true
		if io.ok && m.io.ok && io.reads > m.io.reads {
			u.cmdsPerRead = (io.cmds - m.io.cmds) / (io.reads - m.io.reads)
		}
	}
	if h, ok := hostCPU(); ok && m.hostOK && wall > 0 {
		u.host, u.hostOK = (h-m.host)/wall, true
	}
	return u
}

// addTo sets mClientCPU, mRedisCPU and mHostCPU in mt (those measured): the cores
// used over the rate mt[mOps].
func (u cpuUse) addTo(mt metrics) {
	ops := mt[mOps]
	if ops <= 0 {
		return
	}
	if u.clientOK {
		mt[mClientCPU] = u.client / ops * 1e6
	}
	if u.redisOK {
		mt[mRedisCPU] = u.redis / ops * 1e6
	}
	if u.hostOK {
		mt[mHostCPU] = u.host / ops * 1e6
	}
	if u.cmdsPerRead > 0 {
		mt[mCmdsPerRead] = u.cmdsPerRead
	}
}

// redisIO is Redis's count of commands executed and of reads from client sockets.
type redisIO struct {
	cmds, reads float64
	ok          bool
}

// redisCPU returns the Redis server's CPU seconds so far, and its command and read
// counts, or false on miniredis or when INFO fails (the report then has no Redis
// columns).
func (b *bench) redisCPU(ctx context.Context) (float64, redisIO, bool) {
	if b.srv.redisEmbedded || b.plainRDB == nil {
		return 0, redisIO{}, false
	}
	info, err := b.plainRDB.Info(ctx, "cpu", "stats").Result()
	if err != nil {
		return 0, redisIO{}, false
	}
	cpu, ok := parseRedisCPU(info)
	return cpu, parseRedisIO(info), ok
}

// parseRedisIO reads total_commands_processed and total_reads_processed from INFO
// stats. INFO with two sections, as redisCPU asks, needs Redis 7.0 (this project's
// floor); without either field ok is false.
func parseRedisIO(info string) redisIO {
	v, ok := infoFloats(info, "total_commands_processed", "total_reads_processed")
	if !ok {
		return redisIO{}
	}
	return redisIO{cmds: v[0], reads: v[1], ok: true}
}

// parseRedisCPU sums used_cpu_user and used_cpu_sys from INFO cpu.
func parseRedisCPU(info string) (float64, bool) {
	v, ok := infoFloats(info, "used_cpu_user", "used_cpu_sys")
	if !ok {
		return 0, false
	}
	return v[0] + v[1], true
}

// infoFloats returns the values of the named INFO fields, in the order named, and
// whether every one was there and a number.
func infoFloats(info string, names ...string) ([]float64, bool) {
	vals := make([]float64, len(names))
	seen := make([]bool, len(names))
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, val, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		i := slices.Index(names, name)
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, false
		}
		vals[i], seen[i] = v, true
	}
	return vals, !slices.Contains(seen, false)
}

// procStat is where Linux counts the time each CPU spent in each state.
var procStat = "/proc/stat"

// hostCPU returns the CPU seconds all the machine's CPUs have been busy (/proc/stat),
// or false where there is no /proc/stat.
func hostCPU() (float64, bool) {
	data, err := os.ReadFile(procStat)
	if err != nil {
		return 0, false
	}
	return parseProcStat(string(data))
}

// userHZ is the unit of /proc/stat's times: USER_HZ, 100 on every Linux platform Go
// runs on.
const userHZ = 100

// parseProcStat reads the aggregate "cpu" line of /proc/stat (user nice system idle
// iowait irq softirq steal ...) and returns the busy seconds: all but idle and iowait.
// guest and guest_nice are left out: user and nice already hold them.
func parseProcStat(stat string) (float64, bool) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, false
	}
	var busy uint64
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, false
		}
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return float64(busy) / userHZ, true
}
