//go:build !race

package conntrack

const raceEnabled = false
