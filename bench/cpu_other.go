//go:build !unix

package main

// processCPU is not measured here: the report has no client CPU column.
func processCPU() (float64, bool) { return 0, false }
