package redislog

import (
	"fmt"
	"testing"
	"time"
)

// TestKeySlot: keySlot agrees with Redis's CLUSTER KEYSLOT (the examples
// of its documentation; TestClusterSlotMigration asks a real cluster).
func TestKeySlot(t *testing.T) {
	for key, want := range map[string]int{
		"somekey": 11058, "foo{hash_tag}": 2515, "bar{hash_tag}": 2515, "hash_tag": 2515,
		"foo": 12182, "{foo}": 12182, "a{}b": KeySlot("a{}b"), "{}": crc16Slot("{}"), "x{": crc16Slot("x{"),
	} {
		if got := KeySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
	if KeySlot("a{}b") != crc16Slot("a{}b") {
		t.Error("an empty hash tag must hash the whole key")
	}
}

func crc16Slot(s string) int { return int(crc16(s)) % clusterSlots }

// TestMigratingSlots: a slot that answered TRYAGAIN has its groups of
// several limits decided one limit at a time for migrationMemory, and
// only its own.
func TestMigratingSlots(t *testing.T) {
	var m migratingSlots
	now := time.Now()
	keys := []string{"a:{x}", "b:{x}", "a:{y}", "b:{y}", "g:{global}"}
	groups := [][]int{{0, 1}, {2, 3}, {4}}
	if got := m.split(groups, keys, now); fmt.Sprint(got) != fmt.Sprint(groups) {
		t.Errorf("nothing marked: %v", got)
	}
	m.mark("c:{y}", now)
	want := [][]int{{0, 1}, {2}, {3}, {4}}
	if got := m.split(groups, keys, now.Add(migrationMemory-time.Millisecond)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("{y} marked: %v, want %v", got, want)
	}
	if fmt.Sprint(groups) != "[[0 1] [2 3] [4]]" {
		t.Errorf("split changed its argument: %v", groups)
	}
	if got := m.split(groups, keys, now.Add(migrationMemory)); fmt.Sprint(got) != fmt.Sprint(groups) {
		t.Errorf("after migrationMemory: %v", got)
	}
	if got := splitGroup(groups, 0); fmt.Sprint(got) != "[[0] [1] [2 3] [4]]" {
		t.Errorf("splitGroup: %v", got)
	}
	if allocs := testing.AllocsPerRun(100, func() { m.split(groups, keys, now.Add(time.Hour)) }); allocs != 0 {
		t.Errorf("split with no slot marked allocates %v times", allocs)
	}
}
