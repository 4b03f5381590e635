package main

import (
	"math"
	"testing"
	"time"
)

func TestNewSchedule(t *testing.T) {
	tests := []struct {
		name                string
		rate                float64
		warmup, duration    time.Duration
		requests            int64
		wantWarmup, wantLim int64
	}{
		{"DurationOnly", 1000, 0, 2 * time.Second, 0, 0, 2000},
		{"WarmupAndDuration", 1000, time.Second, 2 * time.Second, 0, 1000, 3000},
		{"RequestsAfterWarmup", 1000, time.Second, 0, 500, 1000, 1500},
		{"RequestsEndFirst", 1000, 0, 10 * time.Second, 500, 0, 500},
		{"DurationEndsFirst", 100, 0, time.Second, 500, 0, 100},
		{"SlowRateRoundsUp", 0.5, 0, 3 * time.Second, 0, 0, 2},
		{"NoFloatCreep", 10, 700 * time.Millisecond, 0, 1, 7, 8},
		{"UntilStopped", 1000, 0, 0, 0, 0, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSchedule(tt.rate, 3, tt.warmup, tt.duration, tt.requests)
			if s.warmup != tt.wantWarmup || s.limit != tt.wantLim {
				t.Fatalf("newSchedule(%v/s, warmup %v, duration %v, requests %d) = warmup %d limit %d, want %d %d",
					tt.rate, tt.warmup, tt.duration, tt.requests, s.warmup, s.limit, tt.wantWarmup, tt.wantLim)
			}
		})
	}
}

func TestScheduleIntendedTimes(t *testing.T) {
	tests := []struct {
		name string
		rate float64
		slot int64
		want time.Duration
	}{
		{"First", 1000, 0, 0},
		{"OneMillisecondApart", 1000, 1, time.Millisecond},
		{"OneSecond", 1000, 1000, time.Second},
		{"FractionalRate", 3, 1, 333333333 * time.Nanosecond},
		{"Hour", 250000, 250000 * 3600, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := newSchedule(tt.rate, 1, 0, 0, 0).at(tt.slot); got != tt.want {
				t.Fatalf("at(%d) at %v/s = %v, want %v", tt.slot, tt.rate, got, tt.want)
			}
		})
	}
}

func TestScheduleClientsShareSlots(t *testing.T) {
	// Every slot belongs to exactly one client, and each client's slots are due in order.
	const clients, perClient = 4, 250
	s := newSchedule(400, clients, 0, 0, 0)
	seen := make(map[int64]int)
	for c := range clients {
		prev := time.Duration(-1)
		for seq := range int64(perClient) {
			i := s.slot(c, seq)
			seen[i]++
			if at := s.at(i); at <= prev {
				t.Fatalf("client %d seq %d due at %v, not after its previous %v", c, seq, at, prev)
			} else {
				prev = at
			}
		}
	}
	for i := range int64(clients * perClient) {
		if seen[i] != 1 {
			t.Fatalf("slot %d taken %d times, want once", i, seen[i])
		}
	}
}
