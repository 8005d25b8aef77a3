#!/bin/sh
# GET: the rows; POST: add the body as a row. Talks to http://db:7000.
url="http://db:7000/cgi-bin/rows?password=$DB_PASSWORD"
if [ "${REQUEST_METHOD:-GET}" = POST ]; then
  body="$(head -c "${CONTENT_LENGTH:-0}")"
  rows="$(wget -q -O- --post-data "$body" "$url")" || rows=""
else
  rows="$(wget -q -O- "$url")" || rows=""
fi
if [ -z "$rows" ] && [ "${REQUEST_METHOD:-GET}" = POST ]; then
  printf 'Status: 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\nthe database did not answer\n'
  exit 0
fi
printf 'Content-Type: text/plain\r\n\r\n%s\n' "$rows"
