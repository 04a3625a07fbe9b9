package testbed

import (
	"strings"
	"testing"
)

// TestResolveSlots: two tables that give a chain the same endpoints in
// different slots of the endpoints maps read the same; other endpoints do
// not. (No test bed needed.)
func TestResolveSlots(t *testing.T) {
	table := func(offset, lo, hi string, ep string) string {
		return "table ip nftproxy {\n" +
			"\tmap endpoints-tcp-0 {\n" +
			"\t\ttypeof numgen random mod 65536 : ip daddr . tcp dport\n" +
			"\t\tflags interval\n" +
			"\t\telements = { " + lo + " : 10.244.1.11 . 8080,\n" +
			"\t\t\t     " + hi + " : " + ep + " . 8080 }\n" +
			"\t}\n\n" +
			"\tchain service-X-default/web/tcp/http {\n" +
			"\t\tmeta l4proto tcp dnat ip to numgen random mod 65536 " + offset + "map @endpoints-tcp-0\n" +
			"\t}\n}\n"
	}
	slot0 := ResolveSlots(table("", "0-32767", "32768-65535", "10.244.2.12"))
	slot2 := ResolveSlots(table("offset 131072 ", "131072-163839", "163840-196607", "10.244.2.12"))
	other := ResolveSlots(table("offset 131072 ", "131072-163839", "163840-196607", "10.244.2.13"))
	if slot0 != slot2 {
		t.Errorf("the same endpoints in slots 0 and 2 differ:\n%s\n%s", slot0, slot2)
	}
	if slot2 == other {
		t.Errorf("other endpoints read the same:\n%s", other)
	}
	if want := "map tcp{0-32767:10.244.1.11 . 8080, 32768-65535:10.244.2.12 . 8080}"; !strings.Contains(slot0, want) {
		t.Errorf("resolved:\n%s\nwant it to contain %q", slot0, want)
	}
	// A proxy that once had more Services keeps an emptied map.
	extra := strings.Replace(table("offset 131072 ", "131072-163839", "163840-196607", "10.244.2.12"),
		"\tchain ", "\tmap endpoints-tcp-1 {\n\t\ttypeof numgen random mod 65536 : ip daddr . tcp dport\n\t\tflags interval\n\t}\n\n\tchain ", 1)
	if got := ResolveSlots(extra); got != slot0 {
		t.Errorf("an extra empty map reads differently:\n%s\nwant\n%s", got, slot0)
	}
	if strings.Contains(slot0, "endpoints-tcp-0") {
		t.Errorf("the endpoints map is still there:\n%s", slot0)
	}
}

// TestResolvePicks: a ClusterIP port reads the same in any pick map of its
// number of endpoints; other endpoints do not.
func TestResolvePicks(t *testing.T) {
	table := func(shard, ep string) string {
		return "table ip nftproxy {\n" +
			"\tmap endpoints-tcp-n2-" + shard + " {\n" +
			"\t\ttypeof ip daddr . tcp dport . numgen random mod 2 : ip daddr . tcp dport\n" +
			"\t\telements = { 10.96.0.10 . 80 . 0 : 10.244.1.11 . 8080,\n" +
			"\t\t\t     10.96.0.10 . 80 . 1 : " + ep + " . 8080 }\n" +
			"\t}\n\n" +
			"\tmap service-ips {\n" +
			"\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n" +
			"\t\telements = { 10.96.0.10 . tcp . 80 comment \"default/web:http\" : goto pick-tcp-2-" + shard + " }\n" +
			"\t}\n\n" +
			"\tchain pick-tcp-2-" + shard + " {\n" +
			"\t\tdnat ip to ip daddr . tcp dport . numgen random mod 2 map @endpoints-tcp-n2-" + shard + "\n" +
			"\t}\n}\n"
	}
	shard0, shard3 := ResolveSlots(table("0", "10.244.2.12")), ResolveSlots(table("3", "10.244.2.12"))
	if shard0 != shard3 {
		t.Errorf("the same endpoints in pick maps 0 and 3 differ:\n%s\n%s", shard0, shard3)
	}
	if other := ResolveSlots(table("3", "10.244.2.13")); other == shard3 {
		t.Errorf("other endpoints read the same:\n%s", other)
	}
	want := `10.96.0.10 . tcp . 80 comment "default/web:http" : pick tcp{0:10.244.1.11 . 8080, 1:10.244.2.12 . 8080}`
	if !strings.Contains(shard0, want) || strings.Contains(shard0, "endpoints-tcp-n2") || strings.Contains(shard0, "chain pick") {
		t.Errorf("resolved:\n%s\nwant it to contain %q and neither the map nor the chain", shard0, want)
	}
}
