package storekit

import (
	"testing"

	"github.com/dedupkit/dedupkit/dedup/driver"
)

func TestAReportIsItsWorstCheck(t *testing.T) {
	if got := Worst([]driver.HealthCheck{{Status: driver.HealthOK}, {Status: driver.HealthUnknown}}); got != driver.HealthOK {
		t.Fatalf("ok+unknown: %s", got)
	}
	if got := Worst([]driver.HealthCheck{{Status: driver.HealthWarn}, {Status: driver.HealthUnknown}}); got != driver.HealthWarn {
		t.Fatalf("warn+unknown: %s", got)
	}
	if got := Worst([]driver.HealthCheck{{Status: driver.HealthWarn}, {Status: driver.HealthFail}, {Status: driver.HealthOK}}); got != driver.HealthFail {
		t.Fatalf("warn+fail: %s", got)
	}
}
